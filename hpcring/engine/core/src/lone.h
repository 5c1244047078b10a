/* The lone request's cycle (lone.c, lone_check.c): what both files share. */
#ifndef HPCRING_LONE_H
#define HPCRING_LONE_H

#include "core.h"

#define INLINE_MAX_BYTES (64 << 10) /* caller_cycles.INLINE_MAX_BYTES */
#define ALL_FLAGS 15ULL             /* bitvector._ALL_FLAGS */

typedef struct {
    PyObject_HEAD
    /* configuration (lone_cycle.build) */
    PyObject *engine, *state, *callers, *wake_put, *python_cycle, *conclude, *watchdog;
    PyObject *negotiation, *exchange, *response_type, *ended_type, *error_type, *describe, *allreduce;
    int handle_size;
    void *in_place;
    /* read once from the configuration */
    PyObject *state_lock, *sets, *stats, *cycle_lock;
    /* what `describe` said for (desc_settings, desc_set) */
    PyObject *desc_settings, *desc_set, *table;
    long long max_bytes;
    double patience; /* < 0: None */
    double stall_every;
    void *comm, *vec_dtype, *band; /* the set's communicator; the negotiation words' datatype and op */
} LoneObject;

/* What one plain cycle works on (borrowed from the set, except where noted). */
typedef struct {
    PyObject *st, *settings; /* new references */
    RequestObject *req;
    const void *src; /* the request's memory (its arrays', or what the one-call submit read) */
    void *dst;
    Py_ssize_t count;
    int typenum;
    PyObject *result; /* what the handle gets: the output array, or the output tensor when never viewed */
    PyObject *bit; /* new reference */
    long bitno;
    int fresh; /* the request is still in `incoming` (else in `cached_wait`) */
    int scan;  /* the patience scan is due: its time is recorded */
    long size;
    double now, post;
    void *dtype, *op;
    int kind; /* 0: no postscale; 1 float32; 2 float64 */
} Plain;

extern PyObject *s_timeline, *s_closed, *s_incoming, *s_inflight, *s_cached_wait, *s_outbox, *s_table, *s_joined;
extern PyObject *s_local_join, *s_abort, *s_overdue, *s_cache, *s_by_name, *s_sigs, *s_lru, *s_version;
extern PyObject *s_move_to_end, *s_last_patience, *s_last_stall, *s_rank, *s_size, *s_ready_key, *s_settings;
extern PyObject *s_inline, *s_cycles, *s_cache_hits, *s_batches, *s_end, *s_lock, *s_acquire;
extern PyObject *s_current, *s_cycle_no, *s_sets, *s_stats, *s_capacity, *s_run_inline, *s_nbytes;
extern PyObject *s_cycle_time_ms, *s_one, *s_lone;

int lone_numpy_init(void); /* lone.c: numpy's C API for that file */

/* A new reference to attribute `name` of `obj`, or NULL with an error. */
#define ATTR(obj, name) PyObject_GetAttr((obj), (name))

/* lone_check.c: attribute and lock helpers (each 0/1 or a value, -1 with an error set) */
Py_ssize_t lone_attr_len(PyObject *obj, PyObject *name);
int lone_attr_double(PyObject *obj, PyObject *name, double *out);
int lone_set_double(PyObject *obj, PyObject *name, double value);
int lone_bump(PyObject *dict, PyObject *key);
int lone_handle_done(PyObject *h);

/* lone_check.c: what describe() said, and whether a wait or a cycle may be the core's */
int lone_described(LoneObject *self, PyObject *settings, PyObject *st);
Py_ssize_t lone_in_flight(LoneObject *self);
int lone_waiter_alone(LoneObject *self, PyObject *handle);
int lone_plain_cycle(LoneObject *self, PyObject *handle, Plain *p);
void lone_plain_clear(Plain *p);

#endif
