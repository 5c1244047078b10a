/* The engine lock: threading.Lock's interface over a PyThread lock, which the core's submit and lone cycle
 * take with two C calls instead of calling `acquire` and `release` (a lock's `acquire` parses its arguments
 * on every call: about half of the 650 instructions the lock cost a submit).
 *
 * Python code uses it as a threading.Lock (`with`, `acquire(blocking, timeout)`, `release`, `locked`). A wait
 * releases the GIL, and a signal that interrupts it runs its handlers (Ctrl-C), as threading.Lock does. */
#include "core.h"

struct CoreLockObject {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked; /* written only by the thread that holds the lock, under the GIL */
};

/* 1 acquired, 0 not within `timeout_us` (-1: wait for ever, 0: do not wait), -1 with an error set (a signal
 * handler raised). */
static int lock_wait(CoreLockObject *self, long long timeout_us) {
    PyLockStatus got = PyThread_acquire_lock_timed(self->lock, 0, 0);
    long long deadline = timeout_us > 0 ? core_now_ns() / 1000 + timeout_us : 0;
    while (got != PY_LOCK_ACQUIRED && timeout_us != 0) {
        long long wait = timeout_us < 0 ? -1 : deadline - core_now_ns() / 1000;
        if (timeout_us > 0 && wait <= 0) break;
        Py_BEGIN_ALLOW_THREADS
        got = PyThread_acquire_lock_timed(self->lock, wait, 1);
        Py_END_ALLOW_THREADS
        if (got == PY_LOCK_INTR) {
            if (Py_MakePendingCalls() < 0) return -1;
        } else if (got != PY_LOCK_ACQUIRED) {
            break; /* timed out */
        }
    }
    if (got != PY_LOCK_ACQUIRED) return 0;
    self->locked = 1;
    return 1;
}

static int core_lock_acquire(CoreLockObject *self) {
    return lock_wait(self, -1) == 1 ? 0 : -1;
}

static int core_lock_release(CoreLockObject *self) {
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    return 0;
}

int core_lock_take(PyObject *lock) {
    if (Py_TYPE(lock) == &CoreLock_Type) return core_lock_acquire((CoreLockObject *)lock);
    PyObject *r = PyObject_CallMethod(lock, "acquire", NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

int core_lock_give(PyObject *lock) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    int rc;
    if (Py_TYPE(lock) == &CoreLock_Type) {
        rc = core_lock_release((CoreLockObject *)lock);
    } else {
        PyObject *r = PyObject_CallMethod(lock, "release", NULL);
        Py_XDECREF(r);
        rc = r == NULL ? -1 : 0;
    }
    if (type != NULL) { /* the error that was already set wins (the `finally` of a `with`) */
        PyErr_Restore(type, value, trace);
        return -1;
    }
    return rc;
}

static PyObject *Lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    CoreLockObject *self = (CoreLockObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void Lock_dealloc(CoreLockObject *self) {
    if (self->lock != NULL) {
        if (self->locked) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* acquire(blocking=True, timeout=-1), with threading.Lock's rules for the two. */
static PyObject *Lock_acquire(CoreLockObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", kwlist, &blocking, &timeout)) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout * 1e6 > (double)PY_TIMEOUT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    long long us = !blocking ? 0 : timeout < 0 ? -1 : (long long)(timeout * 1e6);
    int got = lock_wait(self, us);
    return got < 0 ? NULL : PyBool_FromLong(got);
}

static PyObject *Lock_enter(CoreLockObject *self, PyObject *Py_UNUSED(arg)) {
    if (core_lock_acquire(self) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Lock_release(CoreLockObject *self, PyObject *Py_UNUSED(arg)) {
    if (core_lock_release(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lock_exit(CoreLockObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(n)) {
    if (core_lock_release(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lock_locked(CoreLockObject *self, PyObject *Py_UNUSED(arg)) {
    return PyBool_FromLong(self->locked);
}

static PyObject *Lock_repr(CoreLockObject *self) {
    return PyUnicode_FromFormat("<%s %s lock at %p>", self->locked ? "locked" : "unlocked", Py_TYPE(self)->tp_name,
                                (void *)self);
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1): as threading.Lock.acquire; True when acquired."},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, "release(): as threading.Lock.release."},
    {"locked", (PyCFunction)Lock_locked, METH_NOARGS, "locked(): True while some thread holds it."},
    {"__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Lock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject CoreLock_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.Lock",
    .tp_basicsize = sizeof(CoreLockObject),
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_repr = (reprfunc)Lock_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The engine lock: threading.Lock's interface; the core takes it without calling into Python.",
    .tp_methods = Lock_methods,
    .tp_new = Lock_new,
};
