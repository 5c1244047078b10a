/* Handle, Request and Pending: the objects every request makes, and completion.
 *
 * A waiter sleeps on one process-wide condition variable with the GIL released; the completer marks a whole
 * batch done under the mutex and wakes every waiter once (each re-checks its own handle). Waits are cut into
 * slices so that a signal (Ctrl-C) reaches the main thread's handlers as it does with a Python lock.
 */
#include "core.h"

#include <errno.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

static pthread_mutex_t done_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond;

/* How long one slice of a wait lasts before the waiter checks for signals. */
#define WAIT_SLICE_NS 50000000LL

long long core_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double core_monotonic(void) { return (double)core_now_ns() / 1e9; }

int core_handle_init_sync(void) {
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) return -1;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&done_cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------------ Handle */

static int Handle_init(HandleObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"name", NULL};
    PyObject *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Handle", kwlist, &name)) return -1;
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    return 0;
}

HandleObject *core_handle_new(PyObject *name) {
    HandleObject *h = PyObject_GC_New(HandleObject, &CoreHandle_Type);
    if (h == NULL) return NULL;
    Py_INCREF(name);
    h->name = name;
    Py_INCREF(Py_None);
    h->event = Py_None;
    h->result = NULL;
    h->error = NULL;
    h->done = 0;
    /* Out of the collector while in flight: a name that is a str and no outcome can close no cycle, and the
     * young generation is not scanned, nor filled with survivors, for every request of a step. The outcome
     * (handle_store) tracks it. */
    if (!PyUnicode_CheckExact(name)) PyObject_GC_Track(h);
    return h;
}

static int Handle_traverse(HandleObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->name);
    Py_VISIT(self->event);
    Py_VISIT(self->result);
    Py_VISIT(self->error);
    return 0;
}

static int Handle_clear(HandleObject *self) {
    Py_CLEAR(self->name);
    Py_CLEAR(self->event);
    Py_CLEAR(self->result);
    Py_CLEAR(self->error);
    return 0;
}

static void Handle_dealloc(HandleObject *self) {
    PyObject_GC_UnTrack(self);
    Handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Handle_done(HandleObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(self->done);
}

/* Sleep until `self` is done or `deadline_ns` (< 0: never) passes; 1 done, 0 timed out, -1 error (signal). */
static int handle_block(HandleObject *self, long long deadline_ns) {
    for (;;) {
        int done;
        long long slice_end = core_now_ns() + WAIT_SLICE_NS;
        if (deadline_ns >= 0 && deadline_ns < slice_end) slice_end = deadline_ns;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&done_mutex);
        while (!self->done) {
            struct timespec until = {(time_t)(slice_end / 1000000000LL), (long)(slice_end % 1000000000LL)};
            if (pthread_cond_timedwait(&done_cond, &done_mutex, &until) == ETIMEDOUT) break;
        }
        done = self->done;
        pthread_mutex_unlock(&done_mutex);
        Py_END_ALLOW_THREADS
        if (done) return 1;
        if (deadline_ns >= 0 && core_now_ns() >= deadline_ns) return 0;
        if (PyErr_CheckSignals() < 0) return -1;
    }
}

/* The result of a finished handle (a new reference), or NULL with its error raised. */
static PyObject *handle_outcome(HandleObject *self) {
    if (self->error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(self->error), self->error);
        return NULL;
    }
    PyObject *r = self->result != NULL ? self->result : Py_None;
    Py_INCREF(r);
    return r;
}

PyObject *core_handle_wait(HandleObject *self, PyObject *timeout) {
    if (!self->done) {
        long long deadline = -1;
        if (timeout != NULL && timeout != Py_None) {
            double t = PyFloat_AsDouble(timeout);
            if (t == -1.0 && PyErr_Occurred()) return NULL;
            deadline = core_now_ns() + (t > 0 ? (long long)(t * 1e9) : 0);
        }
        Py_INCREF(self);
        int got = handle_block(self, deadline);
        Py_DECREF(self);
        if (got < 0) return NULL;
        if (got == 0) {
            PyErr_Format(PyExc_TimeoutError, "request %R did not complete within %S s", self->name, timeout);
            return NULL;
        }
    }
    return handle_outcome(self);
}

static PyObject *Handle_wait(HandleObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:wait", kwlist, &timeout)) return NULL;
    return core_handle_wait(self, timeout);
}

/* Store an outcome without marking the handle done (the caller does that under the mutex). */
static void handle_store(HandleObject *h, PyObject *result, PyObject *error) {
    if (!PyObject_GC_IsTracked((PyObject *)h)) PyObject_GC_Track(h); /* an outcome may close a cycle */
    if (error != NULL) {
        Py_INCREF(error);
        Py_XSETREF(h->error, error);
    } else {
        Py_INCREF(result);
        Py_XSETREF(h->result, result);
    }
}

/* The GIL stays held: releasing it here would hand it to another thread in the middle of the engine's cycle
 * (the waiting thread that runs cycles itself would lose its turn). Safe, since no thread ever waits for the
 * GIL while it holds the mutex. */
static void mark_done(HandleObject **handles, Py_ssize_t n) {
    pthread_mutex_lock(&done_mutex);
    for (Py_ssize_t i = 0; i < n; i++) handles[i]->done = 1;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_mutex);
}

static PyObject *Handle_set_result(HandleObject *self, PyObject *result) {
    handle_store(self, result, NULL);
    mark_done(&self, 1);
    Py_RETURN_NONE;
}

static PyObject *Handle_set_error(HandleObject *self, PyObject *error) {
    handle_store(self, NULL, error);
    mark_done(&self, 1);
    Py_RETURN_NONE;
}

static PyMethodDef Handle_methods[] = {
    {"done", (PyCFunction)Handle_done, METH_NOARGS, "True once the result (or error) is available; never blocks."},
    {"wait", (PyCFunction)(void (*)(void))Handle_wait, METH_VARARGS | METH_KEYWORDS,
     "Block (the GIL released) until done; return the result or raise the recorded error."},
    {"set_result", (PyCFunction)Handle_set_result, METH_O, "Complete with a result."},
    {"set_error", (PyCFunction)Handle_set_error, METH_O, "Complete with an error."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Handle_members[] = {
    {"name", T_OBJECT, offsetof(HandleObject, name), 0, "the request's name"},
    {"event", T_OBJECT, offsetof(HandleObject, event), 0, "device routes: the completion event, else None"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject CoreHandle_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Completion of one request: set once by the engine, waited on by the caller.",
    .tp_traverse = (traverseproc)Handle_traverse,
    .tp_clear = (inquiry)Handle_clear,
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
    .tp_members = Handle_members,
    .tp_init = (initproc)Handle_init,
    .tp_new = PyType_GenericNew,
};

/* complete(handles, results, error=None): one pass over a batch, one wake-up for all its waiters. */
PyObject *core_complete(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "complete(handles, results, error=None)");
        return NULL;
    }
    PyObject *error = nargs == 3 && args[2] != Py_None ? args[2] : NULL;
    PyObject *hseq = PySequence_Fast(args[0], "complete: handles must be a sequence");
    if (hseq == NULL) return NULL;
    PyObject *rseq = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hseq);
    PyObject **items = PySequence_Fast_ITEMS(hseq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (Py_TYPE(items[i]) != &CoreHandle_Type) {
            PyErr_Format(PyExc_TypeError, "complete: expected Handle, got %.100s", Py_TYPE(items[i])->tp_name);
            goto fail;
        }
    }
    if (error == NULL) {
        if (args[1] == Py_None) {
            PyErr_SetString(PyExc_TypeError, "complete: results or an error is required");
            goto fail;
        }
        rseq = PySequence_Fast(args[1], "complete: results must be a sequence");
        if (rseq == NULL) goto fail;
        if (PySequence_Fast_GET_SIZE(rseq) != n) {
            PyErr_Format(PyExc_ValueError, "%zd results for %zd handles", PySequence_Fast_GET_SIZE(rseq), n);
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++)
        handle_store((HandleObject *)items[i], rseq ? PySequence_Fast_ITEMS(rseq)[i] : NULL, error);
    mark_done((HandleObject **)items, n);
    Py_XDECREF(rseq);
    Py_DECREF(hseq);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(rseq);
    Py_DECREF(hseq);
    return NULL;
}

/* ----------------------------------------------------------------------------------------------- Request */

static int Request_init(RequestObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"sig", "process_set_id", "tensor", "output", "splits",
                             "handle", "submitted_at", "ready", NULL};
    PyObject *sig, *set_id, *tensor = Py_None, *output = Py_None, *splits = Py_None;
    PyObject *handle = Py_None, *submitted = Py_None, *ready = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OOOOOO:Request", kwlist, &sig, &set_id, &tensor, &output,
                                     &splits, &handle, &submitted, &ready))
        return -1;
    PyObject *name = PyObject_GetAttrString(sig, "name");
    if (name == NULL) return -1;
    if (handle == Py_None) {
        handle = (PyObject *)core_handle_new(name);
        if (handle == NULL) {
            Py_DECREF(name);
            return -1;
        }
    } else {
        Py_INCREF(handle);
        PyObject *old = PyObject_GetAttrString(handle, "name");
        int has = old == NULL ? -1 : PyObject_IsTrue(old);
        Py_XDECREF(old);
        if (has < 0 || (has == 0 && PyObject_SetAttrString(handle, "name", name) < 0)) {
            Py_DECREF(name);
            Py_DECREF(handle);
            return -1;
        }
    }
    Py_DECREF(name);
    if (submitted == Py_None) {
        submitted = PyFloat_FromDouble(core_monotonic());
        if (submitted == NULL) {
            Py_DECREF(handle);
            return -1;
        }
    } else {
        Py_INCREF(submitted);
    }
    Py_INCREF(sig);
    Py_INCREF(set_id);
    Py_INCREF(tensor);
    Py_INCREF(output);
    Py_INCREF(splits);
    Py_INCREF(ready);
    Py_XSETREF(self->sig, sig);
    Py_XSETREF(self->process_set_id, set_id);
    Py_XSETREF(self->tensor, tensor);
    Py_XSETREF(self->output, output);
    Py_XSETREF(self->splits, splits);
    Py_XSETREF(self->handle, handle);
    Py_XSETREF(self->submitted_at, submitted);
    Py_XSETREF(self->ready, ready);
    Py_CLEAR(self->mem.src_base); /* the arrays given replace any memory not viewed yet */
    Py_CLEAR(self->mem.dst_base);
    return 0;
}

RequestObject *core_request_lazy(PyObject *sig, PyObject *set_id, const CoreMemory *mem, HandleObject *handle) {
    RequestObject *r = PyObject_GC_New(RequestObject, &CoreRequest_Type);
    if (r == NULL) return NULL;
    PyObject *submitted = PyFloat_FromDouble(core_monotonic());
    memcpy(&r->mem, mem, offsetof(CoreMemory, dims) + sizeof(Py_ssize_t) * (size_t)mem->nd);
    r->tensor = r->output = NULL;
    if (submitted == NULL) {
        r->sig = r->process_set_id = r->splits = r->handle = r->submitted_at = r->ready = NULL;
        r->mem.src_base = r->mem.dst_base = NULL;
        Py_DECREF(r);
        return NULL;
    }
    Py_INCREF(mem->src_base);
    Py_XINCREF(mem->dst_base);
    r->sig = Py_NewRef(sig);
    r->process_set_id = Py_NewRef(set_id);
    r->splits = Py_NewRef(Py_None);
    r->handle = Py_NewRef((PyObject *)handle);
    r->submitted_at = submitted;
    r->ready = Py_NewRef(Py_None);
    /* Left out of the collector (the one-call submit's request): it refers to atomic values, its tensors
     * and its handle, and nothing a user holds refers to it, so it closes no cycle; the engine's
     * structures hold it while in flight and drop it when done, and reference counting frees it. */
    return r;
}

/* Request.tensor / .output: a request the one-call submit made is viewed here, at the first read. */
static PyObject *Request_get(RequestObject *self, void *closure) {
    if (core_request_unviewed(self) && core_request_view(self) < 0) return NULL;
    PyObject *v = closure == NULL ? self->tensor : self->output;
    return Py_NewRef(v != NULL ? v : Py_None);
}

static int Request_set(RequestObject *self, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a Request's tensor and output cannot be deleted");
        return -1;
    }
    if (core_request_unviewed(self) && core_request_view(self) < 0) return -1;
    Py_XSETREF(*(closure == NULL ? &self->tensor : &self->output), Py_NewRef(value));
    return 0;
}

static int Request_traverse(RequestObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->sig);
    Py_VISIT(self->process_set_id);
    Py_VISIT(self->tensor);
    Py_VISIT(self->output);
    Py_VISIT(self->splits);
    Py_VISIT(self->handle);
    Py_VISIT(self->submitted_at);
    Py_VISIT(self->ready);
    Py_VISIT(self->mem.src_base);
    Py_VISIT(self->mem.dst_base);
    return 0;
}

static int Request_clear(RequestObject *self) {
    Py_CLEAR(self->sig);
    Py_CLEAR(self->process_set_id);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->output);
    Py_CLEAR(self->splits);
    Py_CLEAR(self->handle);
    Py_CLEAR(self->submitted_at);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->mem.src_base);
    Py_CLEAR(self->mem.dst_base);
    return 0;
}

static void Request_dealloc(RequestObject *self) {
    PyObject_GC_UnTrack(self);
    Request_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Request_repr(RequestObject *self) {
    return PyUnicode_FromFormat("Request(%R, process_set_id=%S)", self->sig ? self->sig : Py_None,
                                self->process_set_id ? self->process_set_id : Py_None);
}

static PyMemberDef Request_members[] = {
    {"sig", T_OBJECT, offsetof(RequestObject, sig), 0, NULL},
    {"process_set_id", T_OBJECT, offsetof(RequestObject, process_set_id), 0, NULL},
    {"splits", T_OBJECT, offsetof(RequestObject, splits), 0, NULL},
    {"handle", T_OBJECT, offsetof(RequestObject, handle), 0, NULL},
    {"submitted_at", T_OBJECT, offsetof(RequestObject, submitted_at), 0, NULL},
    {"ready", T_OBJECT, offsetof(RequestObject, ready), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Request_getset[] = {
    {"tensor", (getter)Request_get, (setter)Request_set, "The input: a numpy array (or a device tensor).", NULL},
    {"output", (getter)Request_get, (setter)Request_set, "Where the result lands, or None.", "output"},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject CoreRequest_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One queued collective on this rank (engine/request.py says what each field holds).",
    .tp_traverse = (traverseproc)Request_traverse,
    .tp_clear = (inquiry)Request_clear,
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_repr = (reprfunc)Request_repr,
    .tp_members = Request_members,
    .tp_getset = Request_getset,
    .tp_init = (initproc)Request_init,
    .tp_new = PyType_GenericNew,
};

/* ----------------------------------------------------------------------------------------------- Pending */

static int Pending_init(PendingObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"handles", "finish", "keep", NULL};
    PyObject *handles, *finish, *keep = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O:Pending", kwlist, &handles, &finish, &keep)) return -1;
    Py_INCREF(handles);
    Py_INCREF(finish);
    Py_INCREF(keep);
    Py_XSETREF(self->handles, handles);
    Py_XSETREF(self->finish, finish);
    Py_XSETREF(self->keep, keep);
    return 0;
}

PendingObject *core_pending_new(PyObject *handles, PyObject *finish, PyObject *keep) {
    PendingObject *p = PyObject_GC_New(PendingObject, &CorePending_Type);
    if (p == NULL) return NULL;
    Py_INCREF(handles);
    Py_INCREF(finish);
    Py_INCREF(keep);
    p->handles = handles;
    p->finish = finish;
    p->keep = keep;
    /* Left out of the collector for the reason the submit's request is: only the handle map refers to it. */
    return p;
}

PyObject *core_pending_result(PendingObject *self, PyObject *results) {
    if (self->finish == Py_None) {
        Py_INCREF(self->keep);
        return self->keep;
    }
    return PyObject_CallOneArg(self->finish, results);
}

static PyObject *Pending_result(PendingObject *self, PyObject *results) {
    return core_pending_result(self, results);
}

static int Pending_traverse(PendingObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->handles);
    Py_VISIT(self->finish);
    Py_VISIT(self->keep);
    return 0;
}

static int Pending_clear(PendingObject *self) {
    Py_CLEAR(self->handles);
    Py_CLEAR(self->finish);
    Py_CLEAR(self->keep);
    return 0;
}

static void Pending_dealloc(PendingObject *self) {
    PyObject_GC_UnTrack(self);
    Pending_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Pending_methods[] = {
    {"result", (PyCFunction)Pending_result, METH_O,
     "finish(results), or `keep` itself when there is no finish (an op whose result is its output)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Pending_members[] = {
    {"handles", T_OBJECT, offsetof(PendingObject, handles), 0, NULL},
    {"finish", T_OBJECT, offsetof(PendingObject, finish), 0, NULL},
    {"keep", T_OBJECT, offsetof(PendingObject, keep), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject CorePending_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.Pending",
    .tp_basicsize = sizeof(PendingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "What synchronize() needs for one handle: engine handles, how to build the result, what to keep.",
    .tp_traverse = (traverseproc)Pending_traverse,
    .tp_clear = (inquiry)Pending_clear,
    .tp_dealloc = (destructor)Pending_dealloc,
    .tp_methods = Pending_methods,
    .tp_members = Pending_members,
    .tp_init = (initproc)Pending_init,
    .tp_new = PyType_GenericNew,
};
