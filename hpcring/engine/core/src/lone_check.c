/* The lone request's cycle: whether a wait, and each of its cycles, may run in C (lone.c runs them).
 *
 * Every check here mirrors a condition of the Python path (named in each comment) and changes nothing.
 */
#include "lone.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

PyObject *s_timeline, *s_closed, *s_incoming, *s_inflight, *s_cached_wait, *s_outbox, *s_table, *s_joined;
PyObject *s_local_join, *s_abort, *s_overdue, *s_cache, *s_by_name, *s_sigs, *s_lru, *s_version;
PyObject *s_move_to_end, *s_last_patience, *s_last_stall, *s_rank, *s_size, *s_ready_key, *s_settings;
PyObject *s_inline, *s_cycles, *s_cache_hits, *s_batches, *s_end, *s_lock, *s_acquire;
PyObject *s_current, *s_cycle_no, *s_sets, *s_stats, *s_capacity, *s_run_inline, *s_nbytes;
PyObject *s_cycle_time_ms, *s_one, *s_lone;

static int intern(PyObject **slot, const char *text) {
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

int core_lone_init(void) {
    if (_import_array() < 0 || lone_numpy_init() < 0) return -1;
    s_one = PyLong_FromLong(1);
    if (s_one == NULL) return -1;
    const char *names[] = {"timeline",   "closed",   "incoming",  "inflight",   "cached_wait", "outbox",
                           "table",      "joined",   "local_join", "abort",     "overdue",     "cache",
                           "_by_name",   "_sigs",    "_lru",      "version",    "move_to_end", "last_patience_scan",
                           "last_stall_check", "rank", "size",    "ready_key",  "settings",    "inline",
                           "cycles",     "cache_hits", "batches", "_end",       "lock",        "acquire",
                           "current",  "_cycle_no", "sets",       "stats",       "capacity",
                           "run_inline", "nbytes", "cycle_time_ms", "lone"};
    PyObject **slots[] = {&s_timeline,   &s_closed,   &s_incoming,   &s_inflight,   &s_cached_wait, &s_outbox,
                          &s_table,      &s_joined,   &s_local_join, &s_abort,      &s_overdue,     &s_cache,
                          &s_by_name,    &s_sigs,     &s_lru,        &s_version,    &s_move_to_end, &s_last_patience,
                          &s_last_stall, &s_rank,     &s_size,       &s_ready_key,  &s_settings,    &s_inline,
                          &s_cycles,     &s_cache_hits, &s_batches,  &s_end,        &s_lock,        &s_acquire,
                          &s_current,  &s_cycle_no,   &s_sets,       &s_stats,       &s_capacity,
                          &s_run_inline, &s_nbytes, &s_cycle_time_ms, &s_lone};
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++)
        if (intern(slots[i], names[i]) < 0) return -1;
    return 0;
}

/* ------------------------------------------------------------------------------------- small helpers */


/* The length of container attribute `name` of `obj`, or -1 with an error. */
Py_ssize_t lone_attr_len(PyObject *obj, PyObject *name) {
    PyObject *v = ATTR(obj, name);
    if (v == NULL) return -1;
    Py_ssize_t n = PyObject_Length(v);
    Py_DECREF(v);
    return n;
}

int lone_attr_double(PyObject *obj, PyObject *name, double *out) {
    PyObject *v = ATTR(obj, name);
    if (v == NULL) return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

int lone_set_double(PyObject *obj, PyObject *name, double value) {
    PyObject *v = PyFloat_FromDouble(value);
    if (v == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

/* stats[key] += 1 (EngineState.stats, an int per key). */
int lone_bump(PyObject *dict, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    PyObject *n = PyNumber_Add(v, s_one);
    if (n == NULL) return -1;
    int rc = PyDict_SetItem(dict, key, n);
    Py_DECREF(n);
    return rc;
}

int lone_handle_done(PyObject *h) { return ((HandleObject *)h)->done; }

/* Refresh what `describe` says when the settings or the set changed; 0 or -1. */
int lone_described(LoneObject *self, PyObject *settings, PyObject *st) {
    if (settings == self->desc_settings && st == self->desc_set) return 0;
    PyObject *d = PyObject_CallFunctionObjArgs(self->describe, settings, st, NULL);
    if (d == NULL) return -1;
    int rc = -1;
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 7 || !PyDict_Check(PyTuple_GET_ITEM(d, 6))) {
        PyErr_SetString(PyExc_TypeError, "LoneCycle: describe() must return a 7-tuple ending in a dict");
        goto out;
    }
    self->max_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(d, 0));
    PyObject *patience = PyTuple_GET_ITEM(d, 1);
    self->patience = patience == Py_None ? -1.0 : PyFloat_AsDouble(patience);
    self->stall_every = PyFloat_AsDouble(PyTuple_GET_ITEM(d, 2));
    self->comm = PyLong_AsVoidPtr(PyTuple_GET_ITEM(d, 3));
    self->vec_dtype = PyLong_AsVoidPtr(PyTuple_GET_ITEM(d, 4));
    self->band = PyLong_AsVoidPtr(PyTuple_GET_ITEM(d, 5));
    if (PyErr_Occurred()) goto out;
    Py_XSETREF(self->table, Py_NewRef(PyTuple_GET_ITEM(d, 6)));
    Py_XSETREF(self->desc_settings, Py_NewRef(settings));
    Py_XSETREF(self->desc_set, Py_NewRef(st));
    rc = 0;
out:
    Py_DECREF(d);
    return rc;
}

/* ------------------------------------------------------------------------------------- run_inline's checks */

/* sum(len(st.inflight) for st in sets): CallerCycles._one_in_flight's count, and EngineState.work_pending
 * when above 0; -1 on error. */
Py_ssize_t lone_in_flight(LoneObject *self) {
    Py_ssize_t pos = 0, total = 0;
    PyObject *key, *st;
    while (PyDict_Next(self->sets, &pos, &key, &st)) {
        Py_ssize_t n = lone_attr_len(st, s_inflight);
        if (n < 0) return -1;
        total += n;
    }
    return total;
}

/* CallerCycles._lone_request: the handle's request is the only one in flight, small, not taken in yet
 * (engine lock held). */
int lone_waiter_alone(LoneObject *self, PyObject *handle) {
    Py_ssize_t pos = 0;
    PyObject *key, *st, *found = NULL;
    while (PyDict_Next(self->sets, &pos, &key, &st)) {
        Py_ssize_t n = lone_attr_len(st, s_inflight);
        if (n <= 0) {
            if (n < 0) goto error;
            continue;
        }
        PyObject *incoming = ATTR(st, s_incoming);
        if (incoming == NULL) goto error;
        int single = found == NULL && n == 1 && PyList_CheckExact(incoming) && PyList_GET_SIZE(incoming) == 1;
        if (single) found = Py_NewRef(PyList_GET_ITEM(incoming, 0));
        Py_DECREF(incoming);
        if (!single) {
            Py_XDECREF(found);
            return 0;
        }
    }
    if (found == NULL) return 0;
    int ok = 0;
    if (Py_TYPE(found) == &CoreRequest_Type && ((RequestObject *)found)->handle == handle) {
        RequestObject *r = (RequestObject *)found;
        PyObject *tensor = r->tensor;
        if (core_request_unviewed(r)) {
            ok = r->mem.nbytes <= INLINE_MAX_BYTES;
        } else if (tensor != NULL && PyArray_Check(tensor)) { /* NULL: cleared, not a request to run */
            ok = PyArray_NBYTES((PyArrayObject *)tensor) <= INLINE_MAX_BYTES;
        } else if (tensor != NULL) {
            PyObject *nbytes = PyObject_GetAttr(tensor, s_nbytes);
            if (nbytes == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto error;
                PyErr_Clear();
            } else {
                long long n = PyLong_AsLongLong(nbytes);
                Py_DECREF(nbytes);
                if (n == -1 && PyErr_Occurred()) goto error;
                ok = n <= INLINE_MAX_BYTES;
            }
        }
    }
    Py_DECREF(found);
    return ok;
error:
    Py_XDECREF(found);
    return -1;
}

/* ------------------------------------------------------------------------------- is this cycle plain? */

void lone_plain_clear(Plain *p) {
    Py_CLEAR(p->st);
    Py_CLEAR(p->settings);
    Py_CLEAR(p->bit);
}

/* The reduce table's entry for the request's dtype and op, and the postscale; 1 found, 0 not, -1 error. */
static int plain_reduce(LoneObject *self, Plain *p, PyObject *sig) {
    PyObject *by_dtype = PyDict_GetItemWithError(self->table, PyTuple_GET_ITEM(sig, 4));
    PyObject *entry = by_dtype && PyDict_Check(by_dtype) ? PyDict_GetItemWithError(by_dtype, PyTuple_GET_ITEM(sig, 2))
                                                         : NULL;
    if (entry == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5) return 0;
    p->dtype = PyLong_AsVoidPtr(PyTuple_GET_ITEM(entry, 0));
    p->op = PyLong_AsVoidPtr(PyTuple_GET_ITEM(entry, 1));
    int average = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 2));
    p->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(entry, 3));
    long typenum = PyLong_AsLong(PyTuple_GET_ITEM(entry, 4));
    double post = PyFloat_AsDouble(PyTuple_GET_ITEM(sig, 7));
    if (PyErr_Occurred() || average < 0) return -1;
    /* the arrays are what the signature says (the host plane reduces the array's dtype) */
    if (p->typenum != typenum) return 0;
    p->post = average ? post / (double)p->size : post; /* host_buffers._postscale */
    return p->post == 1.0 || p->kind != 0;
}

/* The request's memory, as small as what `auto` hands to MPI's allreduce: what the one-call submit read
 * (its own checks made it dense and writable), or C-contiguous arrays; 1 yes, 0 no. */
static int plain_arrays(LoneObject *self, Plain *p) {
    RequestObject *r = p->req;
    if (core_request_unviewed(r)) {
        CoreMemory *m = &r->mem;
        if (m->nbytes > self->max_bytes || m->count > INT32_MAX) return 0;
        p->src = m->src;
        p->dst = m->dst;
        p->count = m->count;
        p->typenum = m->typenum;
        p->result = m->dst_base != NULL ? m->dst_base : m->src_base;
        return 1;
    }
    PyObject *tensor = r->tensor, *output = r->output;
    if (tensor == NULL || !PyArray_Check(tensor) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)tensor)) return 0;
    PyArrayObject *src = (PyArrayObject *)tensor;
    if (PyArray_NBYTES(src) > self->max_bytes || PyArray_SIZE(src) == 0 || PyArray_SIZE(src) > INT32_MAX) return 0;
    PyObject *dst = output == Py_None ? tensor : output;
    if (dst != tensor) {
        PyArrayObject *d = (PyArrayObject *)dst;
        if (!PyArray_Check(dst) || !PyArray_IS_C_CONTIGUOUS(d) || !PyArray_ISWRITEABLE(d) ||
            PyArray_SIZE(d) != PyArray_SIZE(src) || PyArray_TYPE(d) != PyArray_TYPE(src))
            return 0;
    } else if (!PyArray_ISWRITEABLE(src)) {
        return 0;
    }
    p->src = PyArray_DATA(src);
    p->dst = PyArray_DATA((PyArrayObject *)dst);
    p->count = PyArray_SIZE(src);
    p->typenum = PyArray_TYPE(src);
    p->result = dst;
    return 1;
}

/* The set's state allows a plain cycle: one set, no timeline, nothing but this request; 1 yes (p->st set). */
static int plain_set(LoneObject *self, Plain *p) {
    if (PyDict_GET_SIZE(self->sets) != 1) return 0;
    int none = core_attr_is(self->state, s_timeline, Py_None);
    int open = none == 1 ? core_attr_is(self->state, s_closed, Py_False) : none;
    if (open != 1) return open;
    Py_ssize_t pos = 0;
    PyObject *key, *st;
    PyDict_Next(self->sets, &pos, &key, &st);
    int ok = core_attr_is(st, s_abort, Py_False);
    if (ok == 1) ok = core_attr_is(st, s_overdue, Py_False);
    if (ok == 1) ok = core_attr_is(st, s_local_join, Py_None);
    Py_ssize_t busy = 0, n;
    PyObject *names[] = {s_joined, s_outbox, s_table};
    for (int i = 0; ok == 1 && i < 3; i++) {
        n = lone_attr_len(st, names[i]);
        if (n < 0) return -1;
        busy += n;
    }
    if (ok != 1 || busy) return ok < 0 ? -1 : 0;
    p->st = Py_NewRef(st);
    return 1;
}

/* Where the request is: alone in `incoming` (fresh) or alone in `cached_wait`; its cache bit. `handle`: the
 * waiter's, whose request it must be (NULL: the engine thread's cycle, anyone's). 1, 0, -1. */
static int plain_request(Plain *p, PyObject *handle) {
    PyObject *incoming = ATTR(p->st, s_incoming);
    PyObject *waiting = incoming ? ATTR(p->st, s_cached_wait) : NULL;
    int rc = -1;
    if (waiting == NULL) goto out;
    rc = 0;
    if (!PyList_CheckExact(incoming) || !PyDict_CheckExact(waiting)) goto out;
    PyObject *req = NULL;
    if (PyList_GET_SIZE(incoming) == 1 && PyDict_GET_SIZE(waiting) == 0) {
        req = PyList_GET_ITEM(incoming, 0);
        p->fresh = 1;
    } else if (PyList_GET_SIZE(incoming) == 0 && PyDict_GET_SIZE(waiting) == 1) {
        Py_ssize_t pos = 0;
        PyObject *bit;
        PyDict_Next(waiting, &pos, &bit, &req);
        p->bit = Py_NewRef(bit);
        p->fresh = 0;
    }
    if (req == NULL || Py_TYPE(req) != &CoreRequest_Type) goto out;
    if (handle != NULL && ((RequestObject *)req)->handle != handle) goto out;
    p->req = (RequestObject *)req;
    rc = 1;
out:
    Py_XDECREF(incoming);
    Py_XDECREF(waiting);
    return rc;
}

/* The request's signature is a cached host allreduce (Negotiator._intake's lookup for a fresh one); 1, 0, -1. */
static int plain_signature(LoneObject *self, Plain *p) {
    PyObject *sig = p->req->sig;
    if (!PyTuple_Check(sig) || PyTuple_GET_SIZE(sig) < 10 || PyTuple_GET_ITEM(sig, 1) != self->allreduce ||
        !PyUnicode_Check(PyTuple_GET_ITEM(sig, 8)) || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(sig, 8), "cpu") ||
        !PyFloat_Check(PyTuple_GET_ITEM(sig, 6)) || PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(sig, 6)) != 1.0 ||
        !PyFloat_Check(PyTuple_GET_ITEM(sig, 7)))
        return 0;
    int rc = plain_reduce(self, p, sig);
    if (rc != 1 || !p->fresh) return rc;
    PyObject *cache = ATTR(p->st, s_cache);
    PyObject *by_name = cache ? ATTR(cache, s_by_name) : NULL;
    PyObject *sigs = by_name ? ATTR(cache, s_sigs) : NULL;
    rc = -1;
    if (sigs == NULL) goto out;
    PyObject *bit = PyDict_GetItemWithError(by_name, PyTuple_GET_ITEM(sig, 0));
    PyObject *cached = bit ? PyDict_GetItemWithError(sigs, bit) : NULL;
    if (cached == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    rc = PyObject_RichCompareBool(cached, sig, Py_EQ);
    if (rc == 1) p->bit = Py_NewRef(bit);
out:
    Py_XDECREF(cache);
    Py_XDECREF(by_name);
    Py_XDECREF(sigs);
    return rc;
}

/* No patience move and no stall check due this cycle (Negotiator._intake, .negotiate); 1, 0, -1. */
static int plain_timers(LoneObject *self, Plain *p) {
    double last;
    p->scan = 0;
    if (self->patience >= 0) {
        if (lone_attr_double(p->st, s_last_patience, &last) < 0) return -1;
        if (p->now - last > self->patience / 4) {
            double submitted = PyFloat_AsDouble(p->req->submitted_at);
            if (submitted == -1.0 && PyErr_Occurred()) return -1;
            if (p->now - submitted > self->patience) return 0;
            p->scan = 1;
        }
    }
    PyObject *rank = ATTR(p->st, s_rank);
    if (rank == NULL) return -1;
    long r = PyLong_AsLong(rank);
    Py_DECREF(rank);
    if (r == -1 && PyErr_Occurred()) return -1;
    if (r != 0) return 1;
    if (lone_attr_double(p->st, s_last_stall, &last) < 0) return -1;
    return p->now - last > self->stall_every ? 0 : 1;
}

/* Whether this cycle is plain (see the module docstring); fills `p`. 1, 0, -1. */
int lone_plain_cycle(LoneObject *self, PyObject *handle, Plain *p) {
    memset(p, 0, sizeof(*p));
    int rc = plain_set(self, p);
    if (rc == 1) rc = plain_request(p, handle);
    if (rc != 1) return rc;
    p->settings = ATTR(self->state, s_settings);
    if (p->settings == NULL || lone_described(self, p->settings, p->st) < 0) return -1;
    if (self->max_bytes < 0) return 0;
    PyObject *size = ATTR(p->st, s_size);
    if (size == NULL) return -1;
    p->size = PyLong_AsLong(size);
    Py_DECREF(size);
    if (p->size == -1 && PyErr_Occurred()) return -1;
    rc = plain_arrays(self, p);
    if (rc == 1) rc = plain_signature(self, p);
    if (rc != 1) return rc;
    p->bitno = PyLong_AsLong(p->bit);
    if (p->bitno < 0) return PyErr_Occurred() ? -1 : 0;
    p->now = core_monotonic();
    return plain_timers(self, p);
}
