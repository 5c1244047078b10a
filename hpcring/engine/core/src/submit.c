/* The submit and synchronize of hpcring.torch's common case in one C call each.
 *
 * `Submitter.allreduce` takes a dense, contiguous CPU tensor of a plain dtype with a name, a reduce op other
 * than Adasum, float scale factors and a registered process set, and does in one pass what
 * hpcring/torch/allreduce_ops.py does for it: the numpy view, the signature, the request, the engine's
 * queue (under the engine's lock, as Engine.submit) and the handle map. Anything else returns
 * NotImplemented before it changes anything, and the Python path (which also words every error) runs.
 * `Submitter.synchronize` waits with the GIL released and builds the result.
 */
#include "core.h"
#include "tensor_reader.h"

#include <string.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

typedef struct {
    PyObject_HEAD
    /* configuration, fixed at construction */
    PyObject *basics;       /* hpcring.torch.basics: its `_engine` */
    PyObject *tls;          /* the grouped-call batch holder (`batch`) */
    PyObject *defer;        /* the deferred-wake flag holder (`on`) */
    PyObject *deferring;    /* list: an entry per thread inside deferred_wake; only when not empty is `on` read */
    PyObject *handle_map;   /* dict: int -> Pending */
    PyObject *handle_ids;   /* itertools.count */
    PyObject *op_names;     /* dict: id(op) -> reduce op name */
    PyObject *average_op;   /* the default op */
    PyObject *adasum_name;  /* Adasum takes the Python path */
    PyObject *tensor_type;  /* torch.Tensor */
    PyObject *strided;      /* torch.strided */
    PyObject *set_type;     /* ProcessSet */
    PyObject *dtypes;       /* dict: torch dtype -> (name, numpy type number, item size) */
    PyObject *sig_type;     /* Signature (a tuple subclass) */
    PyObject *allreduce;    /* OpType.ALLREDUCE */
    PyObject *after_device; /* op_handles._after_device */
    core_read_tensor_fn reader; /* the torch reader's (torch_reader.cpp), or NULL: torch's Python getters */
    PyObject *scalar_types; /* tuple: c10::ScalarType value -> a `dtypes` value, or None (the reader's map) */
    PyObject *noname;       /* op_handles._noname: (generation, set id, op) -> itertools.count */
    /* what repeated calls reuse */
    PyObject *sigs;         /* dict: name -> the Signature last built for it */
    PyObject *last_op;      /* the op of the last call, and its name */
    PyObject *last_op_name;
    long groups_open;       /* grouped calls being built on any thread: only then is `tls` read */
    /* the engine last seen, and what submit reads of it */
    PyObject *engine;
    PyObject *state;
    PyObject *lock;
    PyObject *sets;
    PyObject *put;
    PyObject *run_inline;      /* the engine's run_inline, or NULL when it has none */
    PyObject *last_set;        /* the set state last queued on, its `inflight` and `incoming` (never replaced) */
    PyObject *last_inflight;
    PyObject *last_incoming;
    PyObject *basics_dict;     /* `basics`'s namespace when it is a module: `_engine` read without getattr */
    int on_host;
} SubmitterObject;

static PyObject *s_engine, *s_state, *s_lock, *s_sets, *s_wake, *s_put, *s_on_host, *s_closed;
static PyObject *s_inflight, *s_incoming, *s_batch, *s_on, *s_set_id, *s_is_cpu, *s_layout, *s_requires_grad;
static PyObject *s_is_contiguous, *s_dtype, *s_shape, *s_data_ptr, *s_prefix, *s_cpu;
static PyObject *s_empty, *s_run_inline_name;
static PyObject *s_generation, *s_allreduce_op, *count_type; /* "_generation", "allreduce", itertools.count */

static int intern(PyObject **slot, const char *text) {
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

int core_submit_init(void) {
    if (_import_array() < 0) return -1;
    s_empty = PyTuple_New(0);
    if (s_empty == NULL) return -1;
    if (intern(&s_engine, "_engine") || intern(&s_state, "_state") || intern(&s_lock, "lock") ||
        intern(&s_sets, "sets") || intern(&s_wake, "_wake") || intern(&s_put, "put") ||
        intern(&s_on_host, "cpu_tensors_on_host") || intern(&s_closed, "closed") ||
        intern(&s_inflight, "inflight") || intern(&s_incoming, "incoming") ||
        intern(&s_batch, "batch") || intern(&s_on, "on") || intern(&s_set_id, "process_set_id") ||
        intern(&s_is_cpu, "is_cpu") || intern(&s_layout, "layout") || intern(&s_requires_grad, "requires_grad") ||
        intern(&s_is_contiguous, "is_contiguous") || intern(&s_dtype, "dtype") || intern(&s_shape, "shape") ||
        intern(&s_data_ptr, "data_ptr") ||
        intern(&s_prefix, "allreduce.") || intern(&s_cpu, "cpu") || intern(&s_generation, "_generation") ||
        intern(&s_allreduce_op, "allreduce") || intern(&s_run_inline_name, "run_inline"))
        return -1;
    PyObject *itertools = PyImport_ImportModule("itertools");
    count_type = itertools ? PyObject_GetAttrString(itertools, "count") : NULL;
    Py_XDECREF(itertools);
    return count_type == NULL ? -1 : 0;
}

#define NOT_HANDLED() Py_NewRef(Py_NotImplemented)

static int Submitter_init(SubmitterObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"basics",      "tls",          "defer",     "deferring", "handle_map",
                             "handle_ids",  "op_names",     "average_op", "adasum_name", "tensor_type",
                             "strided",     "set_type",     "dtypes",    "sig_type",  "allreduce",
                             "after_device", "reader",      "scalar_types", "noname", NULL};
    PyObject *v[16], *reader = NULL, *scalar_types = NULL, *noname = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOOO!O!OO!OOOOOO!OOOOO!O!:Submitter", kwlist, &v[0], &v[1],
                                     &v[2], &PyList_Type, &v[15], &PyDict_Type, &v[3], &v[4], &PyDict_Type, &v[5],
                                     &v[6], &v[7], &v[8], &v[9], &v[10], &PyDict_Type, &v[11], &v[12], &v[13],
                                     &v[14], &reader, &PyTuple_Type, &scalar_types, &PyDict_Type, &noname))
        return -1;
    Py_XSETREF(self->noname, Py_NewRef(noname));
    self->reader = NULL;
    if (reader != Py_None) {
        self->reader = (core_read_tensor_fn)PyCapsule_GetPointer(reader, CORE_READER_CAPSULE);
        if (self->reader == NULL) return -1;
    }
    Py_XSETREF(self->scalar_types, Py_NewRef(scalar_types));
    PyObject **slots[16] = {&self->basics,      &self->tls,         &self->defer,      &self->handle_map,
                            &self->handle_ids,  &self->op_names,    &self->average_op, &self->adasum_name,
                            &self->tensor_type, &self->strided,     &self->set_type,   &self->dtypes,
                            &self->sig_type,    &self->allreduce,   &self->after_device, &self->deferring};
    for (int i = 0; i < 16; i++) Py_XSETREF(*slots[i], Py_NewRef(v[i]));
    Py_CLEAR(self->basics_dict);
    if (PyModule_CheckExact(self->basics)) self->basics_dict = Py_NewRef(PyModule_GetDict(self->basics));
    Py_XSETREF(self->sigs, PyDict_New());
    return self->sigs == NULL ? -1 : 0;
}

static void clear_binding(SubmitterObject *self) {
    Py_CLEAR(self->engine);
    Py_CLEAR(self->state);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->sets);
    Py_CLEAR(self->put);
    Py_CLEAR(self->run_inline);
    Py_CLEAR(self->last_set);
    Py_CLEAR(self->last_inflight);
    Py_CLEAR(self->last_incoming);
}

static int Submitter_traverse(SubmitterObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->basics);
    Py_VISIT(self->tls);
    Py_VISIT(self->defer);
    Py_VISIT(self->deferring);
    Py_VISIT(self->handle_map);
    Py_VISIT(self->handle_ids);
    Py_VISIT(self->op_names);
    Py_VISIT(self->average_op);
    Py_VISIT(self->adasum_name);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->strided);
    Py_VISIT(self->set_type);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->sig_type);
    Py_VISIT(self->allreduce);
    Py_VISIT(self->after_device);
    Py_VISIT(self->scalar_types);
    Py_VISIT(self->noname);
    Py_VISIT(self->sigs);
    Py_VISIT(self->last_op);
    Py_VISIT(self->last_op_name);
    Py_VISIT(self->engine);
    Py_VISIT(self->state);
    Py_VISIT(self->lock);
    Py_VISIT(self->sets);
    Py_VISIT(self->put);
    Py_VISIT(self->run_inline);
    Py_VISIT(self->last_set);
    Py_VISIT(self->last_inflight);
    Py_VISIT(self->last_incoming);
    Py_VISIT(self->basics_dict);
    return 0;
}

static int Submitter_clear(SubmitterObject *self) {
    Py_CLEAR(self->basics);
    Py_CLEAR(self->tls);
    Py_CLEAR(self->defer);
    Py_CLEAR(self->deferring);
    Py_CLEAR(self->handle_map);
    Py_CLEAR(self->handle_ids);
    Py_CLEAR(self->op_names);
    Py_CLEAR(self->average_op);
    Py_CLEAR(self->adasum_name);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->strided);
    Py_CLEAR(self->set_type);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->sig_type);
    Py_CLEAR(self->allreduce);
    Py_CLEAR(self->after_device);
    Py_CLEAR(self->scalar_types);
    Py_CLEAR(self->noname);
    Py_CLEAR(self->sigs);
    Py_CLEAR(self->last_op);
    Py_CLEAR(self->last_op_name);
    Py_CLEAR(self->basics_dict);
    clear_binding(self);
    return 0;
}

static void Submitter_dealloc(SubmitterObject *self) {
    PyObject_GC_UnTrack(self);
    Submitter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Point at `engine` (a new one after shutdown/init); 0 or -1 with an error set. */
static int bind_engine(SubmitterObject *self, PyObject *engine) {
    clear_binding(self);
    PyObject *state = PyObject_GetAttr(engine, s_state);
    PyObject *wake = state ? PyObject_GetAttr(engine, s_wake) : NULL;
    PyObject *on_host = wake ? PyObject_GetAttr(engine, s_on_host) : NULL;
    if (on_host == NULL) goto fail;
    self->lock = PyObject_GetAttr(state, s_lock);
    self->sets = self->lock ? PyObject_GetAttr(state, s_sets) : NULL;
    self->put = self->sets ? PyObject_GetAttr(wake, s_put) : NULL;
    if (self->put == NULL) goto fail;
    self->on_host = PyObject_IsTrue(on_host);
    if (self->on_host < 0) goto fail;
    self->run_inline = PyObject_GetAttr(engine, s_run_inline_name);
    if (self->run_inline == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto fail;
        PyErr_Clear(); /* an engine without it: synchronize only waits */
    }
    self->state = state;
    self->engine = Py_NewRef(engine);
    Py_DECREF(wake);
    Py_DECREF(on_host);
    return 0;
fail:
    Py_XDECREF(state);
    Py_XDECREF(wake);
    Py_XDECREF(on_host);
    clear_binding(self);
    return -1;
}

/* What submit read of a tensor: its dtype's name (borrowed from the `dtypes` table), and its memory (`mem.src`,
 * the type number, shape and sizes; the bases are set by the caller). */
typedef struct {
    PyObject *dtype_name;
    CoreMemory mem;
} ReadInfo;

/* The `dtypes` entry's name and type number, and the element count and bytes; 1, or 0 for an empty tensor
 * (not handled here), or -1 on error. */
static int read_entry(PyObject *entry, ReadInfo *info) {
    long typenum = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
    Py_ssize_t itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 2));
    if (PyErr_Occurred()) return -1;
    Py_ssize_t count = 1;
    for (int i = 0; i < info->mem.nd; i++) count *= info->mem.dims[i];
    if (count <= 0) return 0; /* no memory to view: the Python path handles empty tensors */
    info->dtype_name = PyTuple_GET_ITEM(entry, 0);
    info->mem.typenum = (int)typenum;
    info->mem.count = count;
    info->mem.nbytes = count * itemsize;
    return 1;
}

/* The torch reader's answer: 1 read, 0 not handled (a dtype the core does not take), -1 on error; *declined
 * when the reader could not read the tensor at all. */
static int reader_read(SubmitterObject *self, PyObject *t, ReadInfo *info, int *declined) {
    CoreTensorFields f;
    *declined = self->reader(t, &f) != 1;
    if (*declined) return 0;
    PyObject *entry = Py_None;
    if (f.scalar_type >= 0 && f.scalar_type < PyTuple_GET_SIZE(self->scalar_types))
        entry = PyTuple_GET_ITEM(self->scalar_types, f.scalar_type);
    if (entry == Py_None) return 0; /* bool, bfloat16, complex: the Python path */
    info->mem.nd = f.ndim;
    for (int i = 0; i < f.ndim; i++) info->mem.dims[i] = (Py_ssize_t)f.dims[i];
    info->mem.src = f.data;
    return read_entry(entry, info);
}

/* The same through torch's Python attributes (no reader, or it declined: the reader asks nothing of
 * Python, so a tensor it cannot read is asked here, where an error is raised as the Python path would). */
static int getter_read(SubmitterObject *self, PyObject *t, ReadInfo *info) {
    int ok = core_attr_is(t, s_is_cpu, Py_True);
    if (ok == 1) ok = core_attr_is(t, s_layout, self->strided);
    if (ok == 1) ok = core_attr_is(t, s_requires_grad, Py_False);
    if (ok == 1) {
        PyObject *c = PyObject_CallMethodNoArgs(t, s_is_contiguous);
        if (c == NULL) return -1;
        ok = c == Py_True;
        Py_DECREF(c);
    }
    if (ok != 1) return ok;
    PyObject *dt = PyObject_GetAttr(t, s_dtype);
    if (dt == NULL) return -1;
    PyObject *entry = PyDict_GetItemWithError(self->dtypes, dt); /* borrowed */
    Py_DECREF(dt);
    if (entry == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *size = PyObject_GetAttr(t, s_shape);
    if (size == NULL) return -1;
    Py_ssize_t nd = PyTuple_Check(size) ? PyTuple_GET_SIZE(size) : CORE_READER_MAXDIMS + 1;
    int rc = 0;
    if (nd > CORE_READER_MAXDIMS) goto done;
    for (Py_ssize_t i = 0; i < nd; i++) {
        info->mem.dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(size, i));
        if (info->mem.dims[i] < 0) goto other_or_error;
    }
    info->mem.nd = (int)nd;
    rc = read_entry(entry, info);
    if (rc != 1) goto done;
    PyObject *ptr = PyObject_CallMethodNoArgs(t, s_data_ptr);
    if (ptr == NULL) goto error;
    info->mem.src = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (info->mem.src != NULL) goto done;
    rc = 0;
other_or_error:
    if (!PyErr_Occurred()) goto done;
error:
    rc = -1;
done:
    Py_DECREF(size);
    return rc;
}

/* What a dense contiguous CPU tensor of a plain dtype holds: 1 read, 0 any other tensor, -1 on error. */
static int host_read(SubmitterObject *self, PyObject *t, ReadInfo *info) {
    int declined = 1;
    if (self->reader != NULL) {
        int rc = reader_read(self, t, info, &declined);
        if (!declined) return rc;
    }
    return getter_read(self, t, info);
}

/* A numpy array over `data`, `base` kept alive by it; NULL on error. */
static PyObject *array_over(PyObject *base, void *data, const CoreMemory *mem) {
    npy_intp dims[CORE_READER_MAXDIMS];
    for (int i = 0; i < mem->nd; i++) dims[i] = (npy_intp)mem->dims[i];
    PyObject *arr = PyArray_New(&PyArray_Type, mem->nd, dims, mem->typenum, NULL, data, 0, NPY_ARRAY_CARRAY, NULL);
    if (arr == NULL) return NULL;
    if (PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(base)) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

int core_request_view(RequestObject *r) {
    CoreMemory *m = &r->mem;
    PyObject *tensor = array_over(m->src_base, m->src, m);
    if (tensor == NULL) return -1;
    PyObject *output = m->dst_base == NULL ? Py_NewRef(tensor) : array_over(m->dst_base, m->dst, m);
    if (output == NULL) {
        Py_DECREF(tensor);
        return -1;
    }
    Py_XSETREF(r->tensor, tensor);
    Py_XSETREF(r->output, output);
    Py_CLEAR(m->src_base); /* the arrays hold them now */
    Py_CLEAR(m->dst_base);
    return 0;
}

/* 1 when the signature's shape (a tuple of ints) is the viewed tensor's. */
static int same_shape(PyObject *shape, const ReadInfo *info) {
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != info->mem.nd) return 0;
    for (int i = 0; i < info->mem.nd; i++)
        if (PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i)) != (Py_ssize_t)info->mem.dims[i]) return 0;
    return 1;
}

/* The shape as a tuple of ints, as the Python path's signature holds it. */
static PyObject *shape_tuple(const ReadInfo *info) {
    PyObject *shape = PyTuple_New(info->mem.nd);
    for (int i = 0; shape != NULL && i < info->mem.nd; i++) {
        PyObject *d = PyLong_FromSsize_t((Py_ssize_t)info->mem.dims[i]);
        if (d == NULL) Py_CLEAR(shape);
        else PyTuple_SET_ITEM(shape, i, d);
    }
    return shape;
}

static PyObject *new_signature(SubmitterObject *self, PyObject *name, PyObject *dtype, PyObject *shape,
                               PyObject *op_name, PyObject *pre, PyObject *post) {
    PyTypeObject *type = (PyTypeObject *)self->sig_type;
    PyObject *sig = type->tp_alloc(type, 10);
    if (sig == NULL) return NULL;
    PyObject *minus_one = PyLong_FromLong(-1);
    if (minus_one == NULL) {
        Py_DECREF(sig);
        return NULL;
    }
    PyObject *items[10] = {name, self->allreduce, dtype, shape, op_name, minus_one, pre, post, s_cpu, s_empty};
    for (int i = 0; i < 10; i++) PyTuple_SET_ITEM(sig, i, i == 5 ? items[i] : Py_NewRef(items[i]));
    PyObject_GC_UnTrack(sig); /* strings, numbers and a shape: no cycle through it (as CPython untracks tuples) */
    return sig;
}

/* 1 when the factor `given` (a float) equals the signature's `held`, else 0. */
static int same_factor(PyObject *held, PyObject *given) {
    return PyFloat_CheckExact(held) && PyFloat_AS_DOUBLE(held) == PyFloat_AS_DOUBLE(given);
}

/* The signature of this call (a new reference), or NULL on error. A training loop submits the same names
 * with the same tensors step after step: the signature last built for `name` is reused when every field
 * agrees, which spares building the full name (and hashing it again for the in-flight table) and the tuple. */
static PyObject *signature_for(SubmitterObject *self, PyObject *name, const ReadInfo *info, PyObject *op_name,
                               PyObject *pre, PyObject *post, int drawn) {
    PyObject *dtype = info->dtype_name;
    PyObject *sig = drawn ? NULL : PyDict_GetItemWithError(self->sigs, name); /* borrowed */
    if (sig != NULL && PyTuple_GET_ITEM(sig, 2) == dtype && PyTuple_GET_ITEM(sig, 4) == op_name &&
        same_factor(PyTuple_GET_ITEM(sig, 6), pre) && same_factor(PyTuple_GET_ITEM(sig, 7), post) &&
        same_shape(PyTuple_GET_ITEM(sig, 3), info))
        return Py_NewRef(sig);
    if (PyErr_Occurred()) return NULL;
    PyObject *shape = shape_tuple(info);
    PyObject *full = shape ? PyUnicode_Concat(s_prefix, name) : NULL;
    sig = full ? new_signature(self, full, dtype, shape, op_name, pre, post) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(full);
    if (sig == NULL || drawn) return sig; /* a drawn name is never submitted again */
    /* bounded: a loop that invents a name per call must not grow it without end */
    if (PyDict_GET_SIZE(self->sigs) >= 4096) PyDict_Clear(self->sigs);
    if (PyDict_SetItem(self->sigs, name, sig) < 0) Py_CLEAR(sig);
    return sig;
}

/* The next `noname.<n>` of this set's unnamed allreduces (a new reference), as op_handles._name draws it: one
 * itertools.count per (init generation, set id, op), shared with the Python path, so the ranks number their
 * unnamed ops alike whichever path each call takes. No Python code runs between the look-up and the draw. */
static PyObject *draw_noname(SubmitterObject *self, PyObject *set_id) {
    PyObject *generation = self->basics_dict ? Py_XNewRef(PyDict_GetItemWithError(self->basics_dict, s_generation))
                                             : PyObject_GetAttr(self->basics, s_generation);
    if (generation == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "submit: basics has no _generation");
        return NULL;
    }
    PyObject *key = PyTuple_Pack(3, generation, set_id, s_allreduce_op);
    Py_DECREF(generation);
    if (key == NULL) return NULL;
    PyObject *counter = PyDict_GetItemWithError(self->noname, key); /* borrowed */
    if (counter == NULL && !PyErr_Occurred()) {
        PyObject *fresh = PyObject_CallNoArgs(count_type);
        counter = fresh ? PyDict_SetDefault(self->noname, key, fresh) : NULL;
        Py_XDECREF(fresh);
    }
    Py_DECREF(key);
    PyObject *n = counter ? PyIter_Next(counter) : NULL;
    if (n == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "submit: the noname counter ended");
        return NULL;
    }
    PyObject *name = PyUnicode_FromFormat("noname.%S", n);
    Py_DECREF(n);
    return name;
}

/* The set state's `inflight` dict and `incoming` list (borrowed): SetState never replaces them, so those of the
 * last set queued on are kept; 1, 0 when they are not a dict and a list (not handled here), -1 on error. */
static int queues_of(SubmitterObject *self, PyObject *st) {
    if (st == self->last_set) return 1;
    PyObject *inflight = PyObject_GetAttr(st, s_inflight);
    PyObject *incoming = inflight ? PyObject_GetAttr(st, s_incoming) : NULL;
    int rc = incoming == NULL ? -1 : PyDict_CheckExact(inflight) && PyList_CheckExact(incoming);
    if (rc == 1) {
        Py_XSETREF(self->last_set, Py_NewRef(st));
        Py_XSETREF(self->last_inflight, Py_NewRef(inflight));
        Py_XSETREF(self->last_incoming, Py_NewRef(incoming));
    }
    Py_XDECREF(inflight);
    Py_XDECREF(incoming);
    return rc;
}

/* Engine.submit under the engine's lock: 2 queued where nothing was queued before (the engine thread may be
 * waiting for it), 1 queued behind others, 0 not handled here (nothing changed), -1 error. The engine thread
 * ending sets `closed` too, so that flag is the only one read. */
static int queue_request(SubmitterObject *self, PyObject *set_id, PyObject *name, PyObject *req) {
    if (core_lock_take(self->lock) < 0) return -1;
    int rc = core_attr_is(self->state, s_closed, Py_False);
    if (rc != 1) goto out;
    PyObject *st = PyDict_GetItemWithError(self->sets, set_id);
    rc = st == NULL ? (PyErr_Occurred() ? -1 : 0) : queues_of(self, st);
    if (rc != 1) goto out;
    PyObject *inflight = self->last_inflight, *incoming = self->last_incoming;
    PyObject *held = PyDict_SetDefault(inflight, name, req); /* borrowed: `req` unless the name is in flight */
    if (held != req) {
        rc = held == NULL ? -1 : 0;
        goto out;
    }
    rc = PyList_GET_SIZE(incoming) == 0 ? 2 : 1;
    if (PyList_Append(incoming, req) < 0) {
        PyDict_DelItem(inflight, name);
        rc = -1;
    }
out:
    return core_lock_give(self->lock) < 0 ? -1 : rc;
}

/* After queueing: the engine thread's wake-up token, unless this thread runs the cycle itself. */
static int wake_engine(SubmitterObject *self) {
    if (PyList_GET_SIZE(self->deferring) > 0) { /* some thread defers: is it this one? */
        PyObject *on = PyObject_GetAttr(self->defer, s_on);
        if (on == NULL) return -1;
        int deferred = PyObject_IsTrue(on);
        Py_DECREF(on);
        if (deferred != 0) return deferred < 0 ? -1 : 0;
    }
    PyObject *r = PyObject_CallOneArg(self->put, Py_None);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The checks on the arguments that need no tensor: the op's name, or NULL (borrowed; NULL without error:
 * not handled here). The last op and its name are kept: a loop passes the same op call after call. */
static PyObject *plain_op(SubmitterObject *self, PyObject *op, PyObject *average, PyObject *pre, PyObject *post) {
    if (average != Py_None || !PyFloat_CheckExact(pre) || !PyFloat_CheckExact(post)) return NULL;
    if (op == Py_None) op = self->average_op;
    if (op == self->last_op) return self->last_op_name;
    PyObject *key = PyLong_FromVoidPtr(op);
    if (key == NULL) return NULL;
    PyObject *op_name = PyDict_GetItemWithError(self->op_names, key);
    Py_DECREF(key);
    if (op_name == NULL || PyUnicode_Compare(op_name, self->adasum_name) == 0) return NULL;
    Py_XSETREF(self->last_op, Py_NewRef(op));
    Py_XSETREF(self->last_op_name, Py_NewRef(op_name));
    return op_name;
}

/* basics._engine, bound: 1, or 0 when there is none; -1 error. */
static int bound_engine(SubmitterObject *self) {
    PyObject *engine = self->basics_dict ? PyDict_GetItemWithError(self->basics_dict, s_engine) : NULL;
    if (engine != NULL) Py_INCREF(engine);
    else if (!PyErr_Occurred()) engine = PyObject_GetAttr(self->basics, s_engine); /* not a module, or unset */
    if (engine == NULL) return -1;
    int rc = engine != Py_None;
    if (rc == 1 && engine != self->engine && bind_engine(self, engine) < 0) rc = -1;
    Py_DECREF(engine);
    return rc;
}

/* The engine to queue on, bound: 1, or 0 when there is none or it does not take host tensors; -1 error. */
static int current_engine(SubmitterObject *self) {
    int rc = bound_engine(self);
    return rc == 1 && !self->on_host ? 0 : rc;
}

/* Submitter.allreduce's work. `drawn`: NULL, or where an unnamed call's drawn name goes (a new reference) once
 * it is drawn, which is after every check that hands the call to Python: the Python path then gets that name
 * (entry.c), so each call draws one number whichever path takes it. */
static PyObject *submit_allreduce(SubmitterObject *self, PyObject *const *args, PyObject **drawn) {
    PyObject *tensor = args[0], *output = args[1], *name = args[2], *ps = args[7];
    int unnamed = name == Py_None && drawn != NULL;
    if (Py_TYPE(tensor) != (PyTypeObject *)self->tensor_type || !(unnamed || PyUnicode_CheckExact(name)) ||
        Py_TYPE(ps) != (PyTypeObject *)self->set_type ||
        (output != tensor && Py_TYPE(output) != (PyTypeObject *)self->tensor_type))
        return NOT_HANDLED();
    PyObject *op_name = plain_op(self, args[3], args[4], args[5], args[6]);
    if (op_name == NULL) return PyErr_Occurred() ? NULL : NOT_HANDLED();
    int have = current_engine(self);
    if (have != 1) return have < 0 ? NULL : NOT_HANDLED();
    PyObject *batch = NULL; /* the grouped call being built on this thread: its requests go there */
    if (self->groups_open > 0) { /* one is being built somewhere: is it on this thread? */
        batch = PyObject_GetAttr(self->tls, s_batch);
        if (batch == NULL) return NULL;
        if (batch == Py_None) Py_CLEAR(batch);
        else if (!PyList_CheckExact(batch)) {
            Py_DECREF(batch);
            return NOT_HANDLED();
        }
    }
    PyObject *set_id = PyObject_GetAttr(ps, s_set_id);
    if (set_id == NULL) {
        Py_XDECREF(batch);
        return NULL;
    }
    PyObject *result = NULL, *sig = NULL;
    PyObject *req = NULL, *hid = NULL, *pending = NULL, *handles = NULL;
    HandleObject *handle = NULL;
    ReadInfo info, oinfo;
    if (!PyLong_CheckExact(set_id)) goto not_handled;
    int rc = host_read(self, tensor, &info);
    if (rc == 1 && output != tensor) {
        rc = host_read(self, output, &oinfo);
        if (rc == 1 && (oinfo.dtype_name != info.dtype_name || oinfo.mem.nd != info.mem.nd ||
                        memcmp(oinfo.mem.dims, info.mem.dims, sizeof(Py_ssize_t) * (size_t)info.mem.nd) != 0))
            rc = 0;
    }
    if (rc != 1) goto other;
    if (unnamed) {
        name = *drawn = draw_noname(self, set_id);
        if (name == NULL) goto done;
    }
    CoreMemory *mem = &info.mem;
    mem->src_base = tensor;
    mem->dst_base = output == tensor ? NULL : output;
    mem->dst = output == tensor ? mem->src : oinfo.mem.src;
    sig = signature_for(self, name, &info, op_name, args[5], args[6], unnamed);
    PyObject *full = sig ? PyTuple_GET_ITEM(sig, 0) : NULL; /* borrowed */
    handle = full ? core_handle_new(full) : NULL;
    req = handle ? (PyObject *)core_request_lazy(sig, set_id, mem, handle) : NULL;
    if (req == NULL) goto done;
    /* In a group, _submit_group queues the whole batch at once (Engine.submit_many), as _queue leaves it. */
    int queued = batch == NULL ? queue_request(self, set_id, full, req) : PyList_Append(batch, req) < 0 ? -1 : 1;
    if (queued < 1) goto other;
    /* The engine thread looks at `incoming` under the lock before it waits, and empties it whole: a request
     * queued behind others finds the token of the first one's submit still to come, or the thread awake. */
    if (queued == 2 && wake_engine(self) < 0) goto done;
    hid = PyIter_Next(self->handle_ids);
    handles = hid ? PyTuple_New(1) : NULL;
    if (handles == NULL) goto done;
    PyTuple_SET_ITEM(handles, 0, Py_NewRef((PyObject *)handle));
    PyObject_GC_UnTrack(handles); /* only the Pending refers to it */
    pending = (PyObject *)core_pending_new(handles, Py_None, output);
    if (pending == NULL || PyDict_SetItem(self->handle_map, hid, pending) < 0) goto done;
    result = Py_NewRef(hid);
    goto done;
other:
    if (PyErr_Occurred()) goto done;
not_handled:
    result = NOT_HANDLED();
done:
    Py_XDECREF(batch);
    Py_XDECREF(set_id);
    Py_XDECREF(sig);
    Py_XDECREF((PyObject *)handle);
    Py_XDECREF(req);
    Py_XDECREF(hid);
    Py_XDECREF(handles);
    Py_XDECREF(pending);
    return result;
}

/* allreduce(tensor, output, name, op, average, pre, post, process_set, draw=False): a handle, NotImplemented, or
 * with `draw` and no name, the name drawn when the call is left to Python after the draw (its caller passes it
 * on, as the Entry does). */
static PyObject *Submitter_allreduce(SubmitterObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "allreduce(tensor, output, name, op, average, pre, post, process_set, draw=False)");
        return NULL;
    }
    int draw = nargs == 9 ? PyObject_IsTrue(args[8]) : 0;
    if (draw < 0) return NULL;
    PyObject *drawn = NULL;
    PyObject *result = submit_allreduce(self, args, draw ? &drawn : NULL);
    if (result != Py_NotImplemented || drawn == NULL) {
        Py_XDECREF(drawn);
        return result;
    }
    Py_DECREF(result);
    return drawn;
}

PyObject *core_submit_allreduce(PyObject *submitter, PyObject *const *args, PyObject **drawn) {
    return submit_allreduce((SubmitterObject *)submitter, args, drawn);
}

/* group(delta): a grouped call on some thread starts (+1) or ends (-1); while none is open, submit does not
 * read the thread-local batch (a threading.local lookup costs more than the rest of the checks together). */
static PyObject *Submitter_group(SubmitterObject *self, PyObject *delta) {
    long d = PyLong_AsLong(delta);
    if (d == -1 && PyErr_Occurred()) return NULL;
    if (self->groups_open + d < 0) {
        PyErr_SetString(PyExc_ValueError, "group(): more grouped calls ended than started");
        return NULL;
    }
    self->groups_open += d;
    Py_RETURN_NONE;
}

/* A lone request's waiter runs its cycle itself when run_inline's checks allow it, as a synchronous op's does,
 * instead of sleeping until the engine thread has taken the GIL and run it (the submit woke that thread, which
 * then finds nothing to do). */
static int run_inline(SubmitterObject *self, HandleObject *h) {
    /* A first look without a call: others in flight on the set last queued on (a step's gradients) */
    if (self->last_inflight != NULL && PyDict_GET_SIZE(self->last_inflight) > 1) return 0;
    int rc = bound_engine(self);
    if (rc != 1 || self->run_inline == NULL) return rc < 0 ? -1 : 0;
    PyObject *r = PyObject_CallOneArg(self->run_inline, (PyObject *)h);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* synchronize(handle): the op's result; its error raised; None for an unknown handle (Horovod's). */
static PyObject *Submitter_synchronize(SubmitterObject *self, PyObject *handle) {
    if (!PyLong_CheckExact(handle)) return NOT_HANDLED();
    PyObject *pending = PyDict_GetItemWithError(self->handle_map, handle);
    if (pending == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(pending);
    if (PyDict_DelItem(self->handle_map, handle) < 0) {
        Py_DECREF(pending);
        return NULL;
    }
    PyObject *result = NULL, *results = NULL;
    if (Py_TYPE(pending) != &CorePending_Type) {
        PyErr_SetString(PyExc_TypeError, "synchronize: the handle map holds something other than a Pending");
        goto done;
    }
    PyObject *handles = PySequence_Fast(((PendingObject *)pending)->handles, "Pending.handles");
    if (handles == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(handles);
    results = PyList_New(n);
    int device = 0;
    for (Py_ssize_t i = 0; results != NULL && i < n; i++) {
        HandleObject *h = (HandleObject *)PySequence_Fast_GET_ITEM(handles, i);
        if (Py_TYPE(h) != &CoreHandle_Type) {
            PyErr_SetString(PyExc_TypeError, "synchronize: a pending handle is not a Handle");
            Py_CLEAR(results);
            break;
        }
        if (n == 1 && !h->done && run_inline(self, h) < 0) {
            Py_CLEAR(results);
            break;
        }
        PyObject *r = core_handle_wait(h, NULL);
        if (r == NULL) {
            Py_CLEAR(results);
            break;
        }
        PyList_SET_ITEM(results, i, r);
        device |= h->event != Py_None;
    }
    if (results != NULL && device) {
        PyObject *list = PySequence_List(handles);
        PyObject *r = list ? PyObject_CallOneArg(self->after_device, list) : NULL;
        Py_XDECREF(list);
        if (r == NULL) Py_CLEAR(results);
        Py_XDECREF(r);
    }
    Py_DECREF(handles);
    if (results != NULL) result = core_pending_result((PendingObject *)pending, results);
done:
    Py_XDECREF(results);
    Py_DECREF(pending);
    return result;
}

static PyMemberDef Submitter_members[] = {
    {"groups_open", T_LONG, offsetof(SubmitterObject, groups_open), READONLY,
     "Grouped calls being built on any thread."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef Submitter_methods[] = {
    {"allreduce", (PyCFunction)(void (*)(void))Submitter_allreduce, METH_FASTCALL,
     "Submit a host allreduce; the handle, or NotImplemented when the Python path must take it (with draw=True\n"
     "and no name, the name drawn instead when the Python path must take it after the draw)."},
    {"group", (PyCFunction)Submitter_group, METH_O,
     "A grouped call starts (1) or ends (-1) on some thread: submit reads the thread's batch only while one is open."},
    {"synchronize", (PyCFunction)Submitter_synchronize, METH_O,
     "Wait for a handle (the GIL released; a lone request's cycle run first where run_inline allows) and return\n"
     "its result; NotImplemented for a non-int handle."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject CoreSubmitter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring.engine.core._core.Submitter",
    .tp_basicsize = sizeof(SubmitterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "hpcring.torch's submit and synchronize for the common case, in one call each.",
    .tp_traverse = (traverseproc)Submitter_traverse,
    .tp_clear = (inquiry)Submitter_clear,
    .tp_dealloc = (destructor)Submitter_dealloc,
    .tp_methods = Submitter_methods,
    .tp_members = Submitter_members,
    .tp_init = (initproc)Submitter_init,
    .tp_new = PyType_GenericNew,
};
