/* `hvd.allreduce_async_` entered in C: the public function is an Entry over the Python one.
 *
 * A call to a Python function that only forwards to the core's submit costs about as much as a third of the
 * submit itself (the frame, the keyword arguments, two global lookups). The Entry reads the call's arguments
 * as the Python signature would (allreduce_ops.allreduce_async_'s), hands the common case to the Submitter,
 * and calls the Python function with the very same arguments for everything else: anything the submit
 * leaves to Python, an argument it does not know, too many arguments. So every error is still the Python
 * path's, worded there. one_call.entered_in_c puts the Python function's name, docstring and `__wrapped__`
 * on it (inspect.signature follows `__wrapped__`).
 */
#include "core.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *submitter;   /* the core's Submitter */
    PyObject *fallback;    /* the Python function */
    PyObject *default_set; /* its `process_set` default */
    PyObject *dict;        /* __name__, __doc__, __wrapped__, ... */
} EntryObject;

/* allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
 * process_set=global_process_set) */
#define N_PARAMS 7
static const char *const param_names[N_PARAMS] = {"tensor",          "average",          "name",       "op",
                                                  "prescale_factor", "postscale_factor", "process_set"};
static PyObject *s_params[N_PARAMS];
static PyObject *s_one_float;

int core_entry_init(void) {
    for (int i = 0; i < N_PARAMS; i++) {
        s_params[i] = PyUnicode_InternFromString(param_names[i]);
        if (s_params[i] == NULL) return -1;
    }
    s_one_float = PyFloat_FromDouble(1.0);
    return s_one_float == NULL ? -1 : 0;
}

/* The parameter a keyword names, or -1 (interned names compare by identity first, as CPython's own). */
static int param_of(PyObject *key) {
    for (int i = 0; i < N_PARAMS; i++)
        if (key == s_params[i]) return i;
    for (int i = 0; i < N_PARAMS; i++)
        if (PyUnicode_Check(key) && PyUnicode_Compare(key, s_params[i]) == 0) return i;
    return -1;
}

/* The call's arguments in parameter order, defaults filled in; 0 when the Python function must read them. */
static int read_args(EntryObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                     PyObject **v) {
    if (nargs > N_PARAMS) return 0;
    PyObject *defaults[N_PARAMS] = {NULL, Py_None, Py_None, Py_None, s_one_float, s_one_float, self->default_set};
    for (int i = 0; i < N_PARAMS; i++) v[i] = i < nargs ? args[i] : defaults[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        int i = param_of(PyTuple_GET_ITEM(kwnames, k));
        if (i < nargs) return 0; /* unknown (-1), or also given by position */
        v[i] = args[nargs + k];
    }
    return v[0] != NULL;
}

static PyObject *Entry_vectorcall(EntryObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *v[N_PARAMS];
    if (read_args(self, args, PyVectorcall_NARGS(nargsf), kwnames, v)) {
        /* Submitter.allreduce(tensor, output, name, op, average, pre, post, process_set), in place */
        PyObject *call[8] = {v[0], v[0], v[2], v[3], v[1], v[4], v[5], v[6]};
        PyObject *drawn = NULL;
        PyObject *handle = core_submit_allreduce(self->submitter, call, v[2] == Py_None ? &drawn : NULL);
        if (handle != Py_NotImplemented) { /* a handle, or NULL with the submit's error */
            Py_XDECREF(drawn);
            return handle;
        }
        Py_DECREF(handle);
        if (drawn != NULL) { /* an unnamed call the core numbered: the Python path names it so */
            PyObject *named[N_PARAMS] = {v[0], v[1], drawn, v[3], v[4], v[5], v[6]};
            PyObject *r = PyObject_Vectorcall(self->fallback, named, N_PARAMS, NULL);
            Py_DECREF(drawn);
            return r;
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static int Entry_init(EntryObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"submitter", "fallback", "default_set", NULL};
    PyObject *submitter, *fallback, *default_set;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO:Entry", kwlist, &CoreSubmitter_Type, &submitter, &fallback,
                                     &default_set))
        return -1;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Entry: the fallback must be callable");
        return -1;
    }
    Py_XSETREF(self->submitter, Py_NewRef(submitter));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->default_set, Py_NewRef(default_set));
    self->vectorcall = (vectorcallfunc)Entry_vectorcall;
    return 0;
}

/* Pickled by reference, as a module-level function is: the name of the global it is bound to. */
static PyObject *Entry_reduce(EntryObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyObject_GetAttrString((PyObject *)self, "__qualname__");
}

static PyObject *Entry_repr(EntryObject *self) {
    return PyUnicode_FromFormat("<hpcring core entry over %R>", self->fallback ? self->fallback : Py_None);
}

static int Entry_traverse(EntryObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->submitter);
    Py_VISIT(self->fallback);
    Py_VISIT(self->default_set);
    Py_VISIT(self->dict);
    return 0;
}

static int Entry_clear(EntryObject *self) {
    Py_CLEAR(self->submitter);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->default_set);
    Py_CLEAR(self->dict);
    return 0;
}

static void Entry_dealloc(EntryObject *self) {
    PyObject_GC_UnTrack(self);
    Entry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Entry_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    EntryObject *self = (EntryObject *)PyType_GenericNew(type, args, kwds);
    if (self != NULL) self->vectorcall = (vectorcallfunc)Entry_vectorcall;
    return (PyObject *)self;
}

static PyMethodDef Entry_methods[] = {
    {"__reduce__", (PyCFunction)Entry_reduce, METH_NOARGS, "Pickled as the global it is bound to."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject CoreEntry_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.Entry",
    .tp_basicsize = sizeof(EntryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A public function of hpcring.torch entered in C (allreduce_async_), over its Python twin.",
    .tp_vectorcall_offset = offsetof(EntryObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(EntryObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_traverse = (traverseproc)Entry_traverse,
    .tp_clear = (inquiry)Entry_clear,
    .tp_dealloc = (destructor)Entry_dealloc,
    .tp_repr = (reprfunc)Entry_repr,
    .tp_methods = Entry_methods,
    .tp_getset = Entry_getset,
    .tp_init = (initproc)Entry_init,
    .tp_new = Entry_new,
};
