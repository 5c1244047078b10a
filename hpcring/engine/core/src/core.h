/* hpcring's compiled request path: shared declarations (the module is hpcring.engine.core._core). */
#ifndef HPCRING_CORE_H
#define HPCRING_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "tensor_reader.h"

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *event;
    PyObject *result;
    PyObject *error;
    int done; /* written under the completion mutex */
} HandleObject;

/* A request's memory as the one-call submit read it from its tensors, without a numpy view: the compiled lone
 * cycle reduces through the pointers, and Request.tensor and .output make the views only when Python reads
 * them (a cycle the core does not run itself). */
typedef struct {
    PyObject *src_base, *dst_base; /* the torch tensors (owned; NULL once viewed); dst_base NULL: in place */
    void *src, *dst;
    Py_ssize_t count, nbytes;
    int typenum, nd;
    Py_ssize_t dims[CORE_READER_MAXDIMS];
} CoreMemory;

typedef struct {
    PyObject_HEAD
    PyObject *sig;
    PyObject *process_set_id;
    PyObject *tensor; /* NULL while `mem` is not viewed yet */
    PyObject *output;
    PyObject *splits;
    PyObject *handle;
    PyObject *submitted_at;
    PyObject *ready;
    CoreMemory mem; /* used while `tensor` is NULL (src_base set) */
} RequestObject;

typedef struct {
    PyObject_HEAD
    PyObject *handles;
    PyObject *finish;
    PyObject *keep;
} PendingObject;

typedef struct CoreLockObject CoreLockObject; /* lock.c */

extern PyTypeObject CoreLock_Type;
extern PyTypeObject CoreHandle_Type;
extern PyTypeObject CoreRequest_Type;
extern PyTypeObject CorePending_Type;
extern PyTypeObject CoreSubmitter_Type;
extern PyTypeObject CoreEntry_Type;

/* 1 when attribute `attr` of `obj` is `want`, 0 when not, -1 with an error set: the engine's flags are
 * singletons (True, False, None, an enum member), so identity is the check. */
static inline int core_attr_is(PyObject *obj, PyObject *attr, PyObject *want) {
    PyObject *v = PyObject_GetAttr(obj, attr);
    if (v == NULL) return -1;
    int same = v == want;
    Py_DECREF(v);
    return same;
}

/* Take `lock`: in C when it is the core's Lock, else through its `acquire`; 0, or -1 with an error set. */
int core_lock_take(PyObject *lock);
/* Release `lock` the same way, keeping an error already set (then -1), as the `finally` of a `with`. */
int core_lock_give(PyObject *lock);
int core_handle_init_sync(void);
long long core_now_ns(void); /* CLOCK_MONOTONIC, in ns */
double core_monotonic(void);  /* the same in seconds, as time.monotonic() */
HandleObject *core_handle_new(PyObject *name);
PyObject *core_handle_wait(HandleObject *self, PyObject *timeout);
PyObject *core_complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* 1 when `r` is a one-call submit's request whose memory no Python code has viewed yet (then `r->mem` holds it
 * and `r->tensor` is NULL); a request made in Python, or viewed, holds its arrays instead. */
static inline int core_request_unviewed(const RequestObject *r) {
    return r->tensor == NULL && r->mem.src_base != NULL;
}
/* A request over memory not viewed yet (the bases' references are taken). */
RequestObject *core_request_lazy(PyObject *sig, PyObject *set_id, const CoreMemory *mem, HandleObject *handle);
/* Request.tensor and .output made from `mem` (submit.c, where numpy's C API is); 0, or -1 with an error. */
int core_request_view(RequestObject *r);
PendingObject *core_pending_new(PyObject *handles, PyObject *finish, PyObject *keep);
PyObject *core_pending_result(PendingObject *self, PyObject *results);

int core_submit_init(void);
int core_entry_init(void);
/* Submitter.allreduce's 8 arguments: a handle, NotImplemented (a new reference) or NULL with an error. With
 * `drawn`, an unnamed call (name None) is numbered as op_handles._name numbers it, and the name drawn is left
 * there (a new reference) for the Python path when the core then leaves the call to it. */
PyObject *core_submit_allreduce(PyObject *submitter, PyObject *const *args, PyObject **drawn);
int core_lone_init(void);
extern PyTypeObject CoreLoneCycle_Type;

/* MPI entry points looked up in the loaded libmpi (module.c); handle types differ between MPIs (int in
 * MPICH's family, pointers in Open MPI's), so lone.c casts them to the prototype the handle size says. */
typedef int (*core_error_string_fn)(int code, char *text, int *length);
typedef struct {
    void *allreduce;
    void *iallreduce;
    core_error_string_fn error_string;
} CoreMpi;
extern CoreMpi core_mpi;
int core_wait_request(void *request); /* MPI_Test, spinning then backing off; call without the GIL */
PyObject *core_bind_mpi(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *core_wait_mpi(PyObject *module, PyObject *arg);

#endif
