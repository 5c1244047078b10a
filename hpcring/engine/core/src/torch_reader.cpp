/* hpcring.engine.core._torch_reader: the submit's tensor checks through torch's C++ API.
 *
 * Built only where torch is importable when hpcring is built (`pip install --no-build-isolation`), against
 * that torch: the layout of torch's Python tensor object and of its TensorImpl changes between releases, so
 * the module refuses to load under any other torch (the version and git revision are compiled in and checked
 * before anything of torch's is touched). The core (C) calls `read_tensor` through a capsule; it never links
 * torch itself. docs/dev/engine.md, "The torch reader". */
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>

extern "C" {
#include "tensor_reader.h"
}

#ifndef HPCRING_TORCH_VERSION
#error "HPCRING_TORCH_VERSION: setup.py defines it as the torch.__version__ this module is built against"
#endif
#ifndef HPCRING_TORCH_GIT
#error "HPCRING_TORCH_GIT: setup.py defines it as torch.version.git_version"
#endif

namespace {

int read_tensor(PyObject *obj, CoreTensorFields *out) noexcept {
    try {
        if (!THPVariable_CheckExact(obj)) return 0; /* a subclass may redefine anything: its attributes decide */
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.defined() || !t.is_cpu() || t.layout() != c10::kStrided || t.requires_grad()) return 0;
        if (t.is_conj() || t.is_neg() || !t.is_contiguous()) return 0;
        c10::IntArrayRef sizes = t.sizes();
        if (sizes.size() > CORE_READER_MAXDIMS) return 0;
        int64_t count = 1;
        for (size_t i = 0; i < sizes.size(); i++) {
            out->dims[i] = sizes[i];
            count *= sizes[i];
        }
        if (count == 0) return 0; /* no memory to view: the Python path handles empty tensors */
        void *data = t.data_ptr();
        if (data == nullptr) return 0;
        out->data = data;
        out->ndim = static_cast<int>(sizes.size());
        out->scalar_type = static_cast<int>(t.scalar_type());
        return 1;
    } catch (...) { /* no storage, a functorch wrapper...: the Python path says what is wrong */
        return 0;
    }
}

/* scalar_type_of(dtype): the c10::ScalarType value of a torch dtype, for the core's table. */
PyObject *scalar_type_of(PyObject *, PyObject *dtype) {
    if (!THPDtype_Check(dtype)) {
        PyErr_Format(PyExc_TypeError, "scalar_type_of() takes a torch.dtype, not %s", Py_TYPE(dtype)->tp_name);
        return nullptr;
    }
    return PyLong_FromLong(static_cast<long>(reinterpret_cast<THPDtype *>(dtype)->scalar_type));
}

/* read(tensor): what read_tensor gives the core, as (data address, shape, scalar type number), or None when
 * it declines; for the tests, which hold it against torch's own Python answers. */
PyObject *read(PyObject *, PyObject *tensor) {
    CoreTensorFields f;
    if (read_tensor(tensor, &f) != 1) Py_RETURN_NONE;
    PyObject *shape = PyTuple_New(f.ndim);
    for (int i = 0; shape != nullptr && i < f.ndim; i++) {
        PyObject *d = PyLong_FromLongLong(f.dims[i]);
        if (d == nullptr) Py_CLEAR(shape);
        else PyTuple_SET_ITEM(shape, i, d);
    }
    if (shape == nullptr) return nullptr;
    return Py_BuildValue("(NNi)", PyLong_FromVoidPtr(f.data), shape, f.scalar_type);
}

/* Raise ImportError unless the running torch is the one this module was built against. */
int check_torch() {
    PyObject *torch = PyImport_ImportModule("torch");
    if (torch == nullptr) return -1;
    PyObject *version = PyObject_GetAttrString(torch, "__version__");
    PyObject *vmod = version ? PyObject_GetAttrString(torch, "version") : nullptr;
    PyObject *git = vmod ? PyObject_GetAttrString(vmod, "git_version") : nullptr;
    Py_DECREF(torch);
    Py_XDECREF(vmod);
    const char *v = version && PyUnicode_Check(version) ? PyUnicode_AsUTF8(version) : nullptr;
    const char *g = git && PyUnicode_Check(git) ? PyUnicode_AsUTF8(git) : nullptr;
    int same = v != nullptr && g != nullptr && std::strcmp(v, HPCRING_TORCH_VERSION) == 0 &&
               std::strcmp(g, HPCRING_TORCH_GIT) == 0;
    if (!same && !PyErr_Occurred())
        PyErr_Format(PyExc_ImportError,
                     "hpcring's torch reader was built against torch %s (%s), this is torch %s: rebuild it with "
                     "pip install --no-build-isolation hpcring (docs/guide/install.md)",
                     HPCRING_TORCH_VERSION, HPCRING_TORCH_GIT, v ? v : "?");
    Py_XDECREF(version);
    Py_XDECREF(git);
    return same ? 0 : -1;
}

PyMethodDef methods[] = {
    {"scalar_type_of", scalar_type_of, METH_O, "scalar_type_of(dtype): the c10::ScalarType value of a torch dtype."},
    {"read", read, METH_O, "read(tensor): (data address, shape, scalar type) as the core reads it, or None."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_torch_reader", "The submit's tensor checks through torch's C++ API.", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__torch_reader(void) {
    if (check_torch() < 0) return nullptr;
    PyObject *m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    PyObject *capsule = PyCapsule_New(reinterpret_cast<void *>(&read_tensor), CORE_READER_CAPSULE, nullptr);
    int added = capsule == nullptr ? -1 : PyModule_AddObjectRef(m, "READ_TENSOR", capsule);
    Py_XDECREF(capsule);
    if (added < 0 || PyModule_AddStringConstant(m, "TORCH_VERSION", HPCRING_TORCH_VERSION) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
