/* The lone request's cycle: caller_cycles.py's run_inline, with the plain cycle of a small host allreduce in C.
 *
 * hpcring/engine/lone_cycle.py says when a cycle is plain and why the peers cannot tell. Each step below
 * names the Python it mirrors; every check is made before anything changes, and a cycle that is not plain
 * is the Python one (`python_cycle`), called from here. An agreement with another outcome than "all flags,
 * my request ready" goes on in Python from the agreed words (`conclude`).
 */
#include "lone.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <time.h>

/* numpy's C API table is per file: this one's, filled at module set-up (core_lone_init). */
int lone_numpy_init(void) { return _import_array(); }

/* -------------------------------------------------------------------------------- MPI through the handles */

typedef int (*allreduce_i)(const void *, void *, int, int, int, int);
typedef int (*allreduce_p)(const void *, void *, int, void *, void *, void *);
typedef int (*iallreduce_i)(const void *, void *, int, int, int, int, void *);
typedef int (*iallreduce_p)(const void *, void *, int, void *, void *, void *, void *);

/* MPI_Allreduce with handles of this MPI's width (call without the GIL). */
static int mpi_allreduce(LoneObject *self, const void *send, void *recv, int count, void *dtype, void *op) {
    if (self->handle_size == 4)
        return ((allreduce_i)core_mpi.allreduce)(send, recv, count, (int)(intptr_t)dtype, (int)(intptr_t)op,
                                                 (int)(intptr_t)self->comm);
    return ((allreduce_p)core_mpi.allreduce)(send, recv, count, dtype, op, self->comm);
}

/* MPI_Iallreduce, in place, then waited on (call without the GIL). */
static int mpi_iallreduce_wait(LoneObject *self, void *buf, int count, void *dtype, void *op) {
    long long request[2] = {0, 0}; /* MPI_Request: an int or a pointer */
    int rc;
    if (self->handle_size == 4)
        rc = ((iallreduce_i)core_mpi.iallreduce)(self->in_place, buf, count, (int)(intptr_t)dtype,
                                                 (int)(intptr_t)op, (int)(intptr_t)self->comm, request);
    else
        rc = ((iallreduce_p)core_mpi.iallreduce)(self->in_place, buf, count, dtype, op, self->comm, request);
    return rc != 0 ? rc : core_wait_request(request);
}

static PyObject *mpi_error_text(int code) {
    char text[4096];
    int length = 0;
    if (core_mpi.error_string(code, text, &length) != 0 || length <= 0 || length >= (int)sizeof(text))
        return PyUnicode_FromFormat("MPI error code %d", code);
    return PyUnicode_FromStringAndSize(text, length);
}

/* -------------------------------------------------------------------------------------- the object */

static int Lone_init(LoneObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"engine",   "state",         "callers",    "wake_put",   "python_cycle",
                             "conclude", "watchdog",      "negotiation", "exchange",  "response_type",
                             "ended_type", "error_type",  "describe",   "allreduce",  "handle_size",
                             "in_place", NULL};
    PyObject *v[14];
    PyObject *in_place;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOOOOOOOOOOOOOiO:LoneCycle", kwlist, &v[0], &v[1], &v[2],
                                     &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12],
                                     &v[13], &self->handle_size, &in_place))
        return -1;
    if (self->handle_size != 4 && self->handle_size != (int)sizeof(void *)) {
        PyErr_Format(PyExc_ValueError, "LoneCycle: MPI handles of %d bytes are not supported", self->handle_size);
        return -1;
    }
    self->in_place = PyLong_AsVoidPtr(in_place);
    if (self->in_place == NULL && PyErr_Occurred()) return -1;
    PyObject **slots[14] = {&self->engine,      &self->state,       &self->callers,    &self->wake_put,
                            &self->python_cycle, &self->conclude,   &self->watchdog,   &self->negotiation,
                            &self->exchange,    &self->response_type, &self->ended_type, &self->error_type,
                            &self->describe,    &self->allreduce};
    for (int i = 0; i < 14; i++) Py_XSETREF(*slots[i], Py_NewRef(v[i]));
    Py_XSETREF(self->state_lock, ATTR(self->state, s_lock));
    Py_XSETREF(self->sets, self->state_lock ? ATTR(self->state, s_sets) : NULL);
    Py_XSETREF(self->stats, self->sets ? ATTR(self->state, s_stats) : NULL);
    Py_XSETREF(self->cycle_lock, self->stats ? ATTR(self->callers, s_lock) : NULL);
    if (self->cycle_lock == NULL) return -1;
    if (!PyDict_CheckExact(self->sets) || !PyDict_CheckExact(self->stats)) {
        PyErr_SetString(PyExc_TypeError, "LoneCycle: the engine state's sets and stats must be dicts");
        return -1;
    }
    return 0;
}

#define LONE_OBJECTS(X)                                                                                      \
    X(engine) X(state) X(callers) X(wake_put) X(python_cycle) X(conclude) X(watchdog) X(negotiation)        \
        X(exchange) X(response_type) X(ended_type) X(error_type) X(describe) X(allreduce) X(state_lock)     \
            X(sets) X(stats) X(cycle_lock) X(desc_settings) X(desc_set) X(table)

static int Lone_traverse(LoneObject *self, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(self->f);
    LONE_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int Lone_clear(LoneObject *self) {
#define CLEAR(f) Py_CLEAR(self->f);
    LONE_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void Lone_dealloc(LoneObject *self) {
    PyObject_GC_UnTrack(self);
    Lone_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------------------------- the plain cycle */

/* Engine._cycle_sets's bookkeeping: the cycle's number and count. */
static int count_cycle(LoneObject *self) {
    PyObject *no = ATTR(self->engine, s_cycle_no);
    if (no == NULL) return -1;
    PyObject *next = PyNumber_Add(no, s_one);
    Py_DECREF(no);
    if (next == NULL) return -1;
    int rc = PyObject_SetAttr(self->engine, s_cycle_no, next);
    Py_DECREF(next);
    return rc < 0 || lone_bump(self->stats, s_cycles) < 0 ? -1 : lone_bump(self->stats, s_lone);
}

/* watchdog.current = (phase, st, what), or None without a phase; keeps an error already set. */
static int watch(LoneObject *self, PyObject *phase, PyObject *st, PyObject *what) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyObject *cur = phase ? PyTuple_Pack(3, phase, st, what) : Py_NewRef(Py_None);
    int rc = cur == NULL ? -1 : PyObject_SetAttr(self->watchdog, s_current, cur);
    Py_XDECREF(cur);
    if (type != NULL) {
        PyErr_Restore(type, value, trace);
        return -1;
    }
    return rc;
}

/* Negotiator._intake's swap of `incoming`, under the engine lock: 1 taken in, 0 another request arrived since
 * the check (nothing done: the Python cycle runs instead), -1 error. */
static int take_in(LoneObject *self, Plain *p) {
    if (core_lock_take(self->state_lock) < 0) return -1;
    int rc = -1;
    PyObject *incoming = ATTR(p->st, s_incoming);
    if (incoming == NULL) goto out;
    rc = 0;
    if (!PyList_CheckExact(incoming) || PyList_GET_SIZE(incoming) != 1 ||
        PyList_GET_ITEM(incoming, 0) != (PyObject *)p->req)
        goto out;
    rc = PyList_SetSlice(incoming, 0, 1, NULL) < 0 ? -1 : 1; /* emptied, never replaced (set_state.py) */
out:
    Py_XDECREF(incoming);
    return core_lock_give(self->state_lock) < 0 ? -1 : rc;
}

static int set_capacity_words(PyObject *st, Py_ssize_t *words) {
    PyObject *cache = ATTR(st, s_cache);
    PyObject *cap = cache ? ATTR(cache, s_capacity) : NULL;
    Py_XDECREF(cache);
    if (cap == NULL) return -1;
    Py_ssize_t capacity = PyLong_AsSsize_t(cap);
    Py_DECREF(cap);
    if (capacity < 0) return -1;
    *words = (capacity + 63) / 64;
    return 0;
}

/* Negotiator._vector and ._agree: this rank's flags, hit and absent words ANDed over the set. 0 with *out NULL
 * when the outcome is plain (every flag, this request ready), 0 with *out = (flags, hit, absent) otherwise,
 * -1 on error. */
static int agree(LoneObject *self, Plain *p, PyObject **out) {
    *out = NULL;
    if (p->size == 1) return 0; /* a set of one agrees with itself */
    Py_ssize_t words;
    if (set_capacity_words(p->st, &words) < 0) return -1;
    if (p->bitno >= 64 * words) {
        PyErr_SetString(PyExc_RuntimeError, "LoneCycle: a cache bit beyond the cache's capacity");
        return -1;
    }
    Py_ssize_t n = 1 + 2 * words;
    unsigned long long small[1 + 2 * 16] = {0}; /* the default capacity's words, without an allocation */
    unsigned long long *vec = n <= (Py_ssize_t)(sizeof(small) / sizeof(small[0])) ? small
                                                                                  : PyMem_Calloc((size_t)n, sizeof(*vec));
    if (vec == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t word = 1 + p->bitno / 64;
    unsigned long long mask = 1ULL << (p->bitno % 64);
    vec[0] = ALL_FLAGS;
    vec[word] = mask;
    for (Py_ssize_t i = 0; i < words; i++) vec[1 + words + i] = ~0ULL;
    vec[word + words] = ~mask;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mpi_iallreduce_wait(self, vec, (int)n, self->vec_dtype, self->band);
    Py_END_ALLOW_THREADS
    int result = 0;
    if (rc != 0) {
        PyObject *text = mpi_error_text(rc);
        if (text != NULL) PyErr_Format(PyExc_RuntimeError, "the negotiation's MPI_Iallreduce failed: %U", text);
        Py_XDECREF(text);
        result = -1;
    } else if (vec[0] != ALL_FLAGS || !(vec[word] & mask) || (vec[word + words] & mask)) {
        PyObject *flags = PyLong_FromUnsignedLongLong(vec[0]);
        PyObject *hit = _PyLong_FromByteArray((unsigned char *)&vec[1], (size_t)(8 * words), 1, 0);
        PyObject *absent = _PyLong_FromByteArray((unsigned char *)&vec[1 + words], (size_t)(8 * words), 1, 0);
        if (flags && hit && absent) *out = PyTuple_Pack(3, flags, hit, absent);
        Py_XDECREF(flags);
        Py_XDECREF(hit);
        Py_XDECREF(absent);
        result = *out == NULL ? -1 : 0;
    }
    if (vec != small) PyMem_Free(vec);
    return result;
}

/* Negotiator.negotiate's ready response for the request (the cached signature, as `cache.signatures` gives),
 * and the set's ready key. A new reference, or NULL. */
static PyObject *ready_response(LoneObject *self, Plain *p, PyObject *sigs, PyObject *version) {
    PyObject *waiting = ATTR(p->st, s_cached_wait);
    if (waiting == NULL) return NULL;
    int rc = PyDict_DelItem(waiting, p->bit);
    Py_DECREF(waiting);
    PyObject *sig = rc < 0 ? NULL : PyDict_GetItemWithError(sigs, p->bit);
    if (sig == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, p->bit);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)self->response_type;
    PyObject *ready_at = PyFloat_FromDouble(core_monotonic());
    PyObject *response = ready_at ? type->tp_alloc(type, 6) : NULL;
    if (response == NULL) {
        Py_XDECREF(ready_at);
        return NULL;
    }
    PyObject *items[6] = {sig, (PyObject *)p->req, Py_None, Py_None, ready_at, p->bit};
    for (int i = 0; i < 6; i++) PyTuple_SET_ITEM(response, i, i == 4 ? items[i] : Py_NewRef(items[i]));
    PyObject *ready = PyNumber_Lshift(s_one, p->bit);
    PyObject *key = ready ? PyTuple_Pack(3, ready, version, s_one) : NULL;
    rc = key == NULL ? -1 : PyObject_SetAttr(p->st, s_ready_key, key);
    Py_XDECREF(ready);
    Py_XDECREF(key);
    if (rc < 0 || lone_bump(self->stats, s_cache_hits) < 0) Py_CLEAR(response);
    return response;
}

static void postscale(Plain *p) {
    Py_ssize_t n = p->count;
    if (p->kind == 1) { /* float32 times a float32 factor, as numpy multiplies by a Python float */
        float *x = (float *)p->dst, f = (float)p->post;
        for (Py_ssize_t i = 0; i < n; i++) x[i] *= f;
    } else {
        double *x = (double *)p->dst;
        for (Py_ssize_t i = 0; i < n; i++) x[i] *= p->post;
    }
}

/* MPI_Allreduce, then the postscale; callable without the GIL. */
static int allreduce_scaled(LoneObject *self, Plain *p, const void *send, void *recv, int count) {
    int rc = mpi_allreduce(self, send, recv, count, p->dtype, p->op);
    if (rc == 0 && p->post != 1.0) postscale(p);
    return rc;
}

/* HostPlane's latency path: MPI's allreduce where the request lies (in place when the output is the input),
 * then the postscale. NULL on success, else the CollectiveError the handle gets (a new reference). */
static PyObject *reduce(LoneObject *self, Plain *p, PyObject **failed) {
    *failed = NULL;
    const void *send = p->dst == p->src ? self->in_place : p->src;
    void *recv = p->dst;
    int count = (int)p->count;
    int rc;
    if (p->size == 1) { /* a copy of at most max_bytes: letting the GIL go would cost a switch back */
        rc = allreduce_scaled(self, p, send, recv, count);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = allreduce_scaled(self, p, send, recv, count);
        Py_END_ALLOW_THREADS
    }
    if (rc == 0) return NULL;
    PyObject *text = mpi_error_text(rc);
    PyObject *msg = text ? PyUnicode_FromFormat("allreduce of %R failed: %U", PyTuple_GET_ITEM(p->req->sig, 0), text)
                         : NULL;
    *failed = msg ? PyObject_CallOneArg(self->error_type, msg) : NULL;
    Py_XDECREF(text);
    Py_XDECREF(msg);
    return *failed;
}

/* Executor._finish_many for one response: out of `inflight` if still there, then the handle completed. */
static int finish(LoneObject *self, Plain *p, PyObject *error) {
    PyObject *name = PyTuple_GET_ITEM(p->req->sig, 0);
    if (core_lock_take(self->state_lock) < 0) return -1;
    PyObject *inflight = ATTR(p->st, s_inflight);
    int rc = inflight == NULL ? -1 : 0;
    if (rc == 0) {
        PyObject *was = PyDict_GetItemWithError(inflight, name);
        if (was == (PyObject *)p->req) rc = PyDict_DelItem(inflight, name);
        else if (was == NULL && PyErr_Occurred()) rc = -1;
    }
    Py_XDECREF(inflight);
    if (core_lock_give(self->state_lock) < 0 || rc < 0) return -1;
    PyObject *handles = PyTuple_Pack(1, p->req->handle);
    PyObject *results = handles ? PyList_New(1) : NULL;
    if (results == NULL) {
        Py_XDECREF(handles);
        return -1;
    }
    PyList_SET_ITEM(results, 0, Py_NewRef(p->result));
    PyObject *args[3] = {handles, results, error ? error : Py_None};
    PyObject *r = core_complete(NULL, args, 3);
    Py_DECREF(handles);
    Py_DECREF(results);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The agreed request executed (Engine._after_negotiation, Executor.execute, ._run_batch, _remember,
 * ._finish_many for one host allreduce). */
static int execute(LoneObject *self, Plain *p) {
    PyObject *cache = ATTR(p->st, s_cache);
    PyObject *sigs = cache ? ATTR(cache, s_sigs) : NULL;
    PyObject *lru = sigs ? ATTR(cache, s_lru) : NULL;
    PyObject *version = lru ? ATTR(cache, s_version) : NULL;
    PyObject *response = version ? ready_response(self, p, sigs, version) : NULL;
    PyObject *batch = response ? PyList_New(1) : NULL;
    PyObject *error = NULL, *moved = NULL;
    int rc = -1;
    if (batch == NULL) goto out;
    PyList_SET_ITEM(batch, 0, Py_NewRef(response));
    if (watch(self, self->exchange, p->st, batch) < 0 || lone_bump(self->stats, s_batches) < 0) goto out;
    if (reduce(self, p, &error) == NULL && PyErr_Occurred()) goto out;
    /* _remember: a cached signature put again becomes the most recently executed */
    moved = PyObject_CallMethodOneArg(lru, s_move_to_end, p->bit);
    if (moved == NULL) goto out;
    rc = finish(self, p, error);
out:
    Py_XDECREF(cache);
    Py_XDECREF(sigs);
    Py_XDECREF(lru);
    Py_XDECREF(version);
    Py_XDECREF(response);
    Py_XDECREF(batch);
    Py_XDECREF(error);
    Py_XDECREF(moved);
    return rc;
}

/* Intake, agreement and, when plain, execution: 0 go on, 1 the engine must stop, -1 error. */
static int plain_body(LoneObject *self, Plain *p) {
    if (p->fresh) {
        PyObject *waiting = ATTR(p->st, s_cached_wait);
        int rc = waiting == NULL ? -1 : PyDict_SetItem(waiting, p->bit, (PyObject *)p->req);
        Py_XDECREF(waiting);
        if (rc < 0) return -1;
    }
    if (p->scan && lone_set_double(p->st, s_last_patience, p->now) < 0) return -1;
    PyObject *agreed;
    if (agree(self, p, &agreed) < 0) return -1;
    if (agreed == NULL) return execute(self, p);
    PyObject *now = PyFloat_FromDouble(p->now);
    PyObject *r = now ? PyObject_CallFunctionObjArgs(self->conclude, p->st, now, PyTuple_GET_ITEM(agreed, 0),
                                                     PyTuple_GET_ITEM(agreed, 1), PyTuple_GET_ITEM(agreed, 2), NULL)
                      : NULL;
    Py_XDECREF(now);
    Py_DECREF(agreed);
    if (r == NULL) return -1;
    int ended = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ended;
}

/* Engine._cycle when plain. *ran is 0 when it did not run (the Python cycle must). */
static int plain_run(LoneObject *self, Plain *p, int *ran) {
    *ran = 0;
    if (p->fresh) {
        int taken = take_in(self, p);
        if (taken <= 0) return taken;
    }
    *ran = 1;
    if (count_cycle(self) < 0 || watch(self, self->negotiation, p->st, Py_None) < 0) return -1;
    int rc = plain_body(self, p);
    if (watch(self, NULL, NULL, NULL) < 0 && rc >= 0) return -1;
    return rc;
}

/* ------------------------------------------------------------------------------------------- run_inline */

/* CallerCycles._cycles_until: cycles until the handle is done, each the plain one in C or the Python one.
 * 0 done or handed to the engine thread (callers._end), -1 an error to raise (not an Exception). */
static int cycles_until(LoneObject *self, PyObject *handle) {
    while (!lone_handle_done(handle)) {
        double start = core_monotonic();
        Plain p;
        int ran = 0;
        int rc = lone_plain_cycle(self, handle, &p);
        if (rc == 1) rc = plain_run(self, &p, &ran);
        lone_plain_clear(&p);
        if (rc >= 0 && !ran) {
            PyObject *r = PyObject_CallNoArgs(self->python_cycle);
            rc = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
        }
        if (rc < 0) { /* the engine thread reports it and stops, failing this handle too */
            PyObject *type, *value, *trace;
            PyErr_Fetch(&type, &value, &trace);
            PyErr_NormalizeException(&type, &value, &trace);
            if (trace != NULL && value != NULL) PyException_SetTraceback(value, trace);
            int plain = PyErr_GivenExceptionMatches(type, PyExc_Exception);
            if (PyObject_SetAttr(self->callers, s_end, value ? value : Py_None) < 0) PyErr_Clear();
            if (plain) {
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(trace);
                return 0;
            }
            PyErr_Restore(type, value, trace); /* Ctrl-C in the caller: the engine stops, the caller sees it */
            return -1;
        }
        if (rc == 1) {
            PyObject *ended = PyObject_CallNoArgs(self->ended_type);
            int set = ended == NULL ? -1 : PyObject_SetAttr(self->callers, s_end, ended);
            Py_XDECREF(ended);
            return set;
        }
        if (lone_handle_done(handle)) return 0;
        if (core_lock_take(self->state_lock) < 0) return -1;
        int closed = core_attr_is(self->state, s_closed, Py_True);
        if (core_lock_give(self->state_lock) < 0 || closed < 0) return -1;
        if (closed) return 0;
        PyObject *settings = ATTR(self->state, s_settings);
        double cycle_ms = 0.0;
        int got = settings == NULL ? -1 : lone_attr_double(settings, s_cycle_time_ms, &cycle_ms);
        Py_XDECREF(settings);
        if (got < 0) return -1;
        double delay = start + cycle_ms / 1000.0 - core_monotonic();
        if (delay > 0) {
            struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
            Py_BEGIN_ALLOW_THREADS
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            if (PyErr_CheckSignals() < 0) return -1;
        }
    }
    return 0;
}

/* CallerCycles.run_inline(handle, deferred=False), with the plain cycles in C. */
static PyObject *Lone_run_inline(LoneObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "run_inline(handle, deferred=False)");
        return NULL;
    }
    PyObject *handle = args[0];
    int deferred = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    if (deferred < 0) return NULL;
    if (Py_TYPE(handle) != &CoreHandle_Type) /* not the core's: the Python twin knows what to do */
        return PyObject_CallMethodObjArgs(self->callers, s_run_inline, handle, deferred ? Py_True : Py_False, NULL);
    if (lone_handle_done(handle)) Py_RETURN_NONE;
    int rc = core_attr_is(self->state, s_timeline, Py_None);
    if (rc == 1) {
        Py_ssize_t inflight = lone_in_flight(self);
        rc = inflight < 0 ? -1 : inflight == 1;
    }
    PyObject *got = NULL;
    if (rc == 1) {
        got = PyObject_CallMethodOneArg(self->cycle_lock, s_acquire, Py_False);
        rc = got == NULL ? -1 : got == Py_True;
        Py_XDECREF(got);
    }
    if (rc < 0) return NULL;
    if (rc == 0) {
        if (deferred) return PyObject_CallOneArg(self->wake_put, Py_None); /* put() returns None */
        Py_RETURN_NONE;
    }
    int failed = core_lock_take(self->state_lock);
    int allowed = failed < 0 ? -1 : core_attr_is(self->state, s_closed, Py_False);
    if (allowed == 1) allowed = core_attr_is(self->callers, s_end, Py_None);
    if (allowed == 1) allowed = lone_waiter_alone(self, handle);
    if (failed == 0 && core_lock_give(self->state_lock) < 0) allowed = -1;
    if (allowed == 1) allowed = lone_bump(self->stats, s_inline) < 0 ? -1 : 1;
    if (allowed == 1 && cycles_until(self, handle) < 0) allowed = -1;
    if (core_lock_give(self->cycle_lock) < 0) allowed = -1;
    if (allowed < 0) return NULL;
    /* what is left (another thread's request, a stop) is the engine thread's */
    if (core_lock_take(self->state_lock) < 0) return NULL;
    Py_ssize_t inflight = lone_in_flight(self);
    int ended = inflight < 0 ? -1 : core_attr_is(self->callers, s_end, Py_None);
    int left = ended < 0 ? -1 : inflight > 0 || !ended;
    if (core_lock_give(self->state_lock) < 0 || left < 0) return NULL;
    if (left) {
        PyObject *r = PyObject_CallOneArg(self->wake_put, Py_None);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* Engine._cycle for the engine thread: the plain cycle in C when it is one (whoever's the lone request), else
 * the Python cycle. True when the engine must stop. */
static PyObject *Lone_cycle(LoneObject *self, PyObject *Py_UNUSED(ignored)) {
    Plain p;
    int ran = 0;
    int rc = lone_plain_cycle(self, NULL, &p);
    if (rc == 1) rc = plain_run(self, &p, &ran);
    lone_plain_clear(&p);
    if (rc < 0) return NULL;
    if (!ran) return PyObject_CallNoArgs(self->python_cycle);
    return PyBool_FromLong(rc);
}

static PyMethodDef Lone_methods[] = {
    {"run_inline", (PyCFunction)(void (*)(void))Lone_run_inline, METH_FASTCALL,
     "CallerCycles.run_inline(handle, deferred=False), the plain cycles of a small host allreduce in C."},
    {"cycle", (PyCFunction)Lone_cycle, METH_NOARGS,
     "Engine._cycle: the plain cycle of a lone small host allreduce in C, else the Python one."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject CoreLoneCycle_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.LoneCycle",
    .tp_basicsize = sizeof(LoneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The lone request's cycles, run by the waiting thread (engine/lone_cycle.py).",
    .tp_traverse = (traverseproc)Lone_traverse,
    .tp_clear = (inquiry)Lone_clear,
    .tp_dealloc = (destructor)Lone_dealloc,
    .tp_methods = Lone_methods,
    .tp_init = (initproc)Lone_init,
    .tp_new = PyType_GenericNew,
};
