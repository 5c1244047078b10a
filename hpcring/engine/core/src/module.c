/* hpcring.engine.core._core: module set-up, and waiting on an MPI request with the GIL released.
 *
 * The engine's negotiation waits on a non-blocking allreduce: spin on MPI_Test for a short while, then sleep
 * with exponential backoff (hpcring/collective/progress.py says why). Done in Python, every test takes the
 * GIL back from the training thread; here the whole wait runs without it. MPI_Test is looked up in the
 * libmpi mpi4py already loaded, so the extension links no MPI of its own and works with either flavour.
 */
#include "core.h"

#include <dlfcn.h>
#include <time.h>

typedef int (*mpi_test_fn)(void *request, int *flag, void *status);

static mpi_test_fn mpi_test = NULL;
CoreMpi core_mpi = {NULL, NULL, NULL};

#define SPIN_NS 200000LL
#define MIN_BACKOFF_NS 50000LL
#define MAX_BACKOFF_NS 500000LL

/* bind_mpi(path): find MPI_Test (and what the lone cycle calls) in the already-loaded libmpi at `path`;
 * True when MPI_Test was found. */
PyObject *core_bind_mpi(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind_mpi(path: str)");
        return NULL;
    }
    const char *path = PyUnicode_AsUTF8(args[0]);
    if (path == NULL) return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) Py_RETURN_FALSE;
    mpi_test = (mpi_test_fn)dlsym(lib, "MPI_Test");
    core_mpi.allreduce = dlsym(lib, "MPI_Allreduce");
    core_mpi.iallreduce = dlsym(lib, "MPI_Iallreduce");
    core_mpi.error_string = (core_error_string_fn)dlsym(lib, "MPI_Error_string");
    return PyBool_FromLong(mpi_test != NULL);
}

/* mpi_bound(): every MPI entry point the lone cycle calls was found by bind_mpi. */
static PyObject *core_mpi_bound(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg)) {
    return PyBool_FromLong(mpi_test != NULL && core_mpi.allreduce != NULL && core_mpi.iallreduce != NULL &&
                           core_mpi.error_string != NULL);
}

static int test_once(void *request, int *error) {
    /* MPI_Status is 20-24 bytes in the MPIs we support; room to spare, aligned for any field. */
    long long status[16];
    int flag = 0;
    *error = mpi_test(request, &flag, status);
    return flag;
}

int core_wait_request(void *request) {
    int error = 0;
    long long start = core_now_ns();
    long long pause = MIN_BACKOFF_NS;
    while (!test_once(request, &error) && error == 0) {
        if (core_now_ns() - start < SPIN_NS) continue;
        struct timespec ts = {0, (long)pause};
        nanosleep(&ts, NULL);
        pause = pause * 2 > MAX_BACKOFF_NS ? MAX_BACKOFF_NS : pause * 2;
    }
    return error;
}

/* wait_mpi(address): wait for the MPI_Request at `address` (mpi4py's `MPI._addressof(req)`). */
PyObject *core_wait_mpi(PyObject *Py_UNUSED(module), PyObject *arg) {
    if (mpi_test == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "wait_mpi: bind_mpi() found no MPI_Test");
        return NULL;
    }
    void *request = PyLong_AsVoidPtr(arg);
    if (request == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "wait_mpi: null request address");
        return NULL;
    }
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    error = core_wait_request(request);
    Py_END_ALLOW_THREADS
    if (error != 0) {
        PyErr_Format(PyExc_RuntimeError, "MPI_Test failed with error code %d", error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"complete", (PyCFunction)(void (*)(void))core_complete, METH_FASTCALL,
     "complete(handles, results, error=None): finish a batch of handles, one wake-up for their waiters."},
    {"bind_mpi", (PyCFunction)(void (*)(void))core_bind_mpi, METH_FASTCALL,
     "bind_mpi(path): look MPI_Test up in the loaded libmpi at path; True when found."},
    {"mpi_bound", (PyCFunction)core_mpi_bound, METH_NOARGS,
     "mpi_bound(): True when bind_mpi also found what the lone cycle calls."},
    {"wait_mpi", (PyCFunction)core_wait_mpi, METH_O,
     "wait_mpi(address): wait for an MPI request, spinning then backing off, the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "hpcring's compiled request path (hpcring/engine/core/__init__.py).", -1,
    core_methods,
};

static int add_type(PyObject *m, PyTypeObject *type, const char *name) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__core(void) {
    if (core_handle_init_sync() < 0) {
        PyErr_SetString(PyExc_RuntimeError, "hpcring core: cannot create its condition variable");
        return NULL;
    }
    if (core_submit_init() < 0 || core_entry_init() < 0 || core_lone_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL) return NULL;
    if (add_type(m, &CoreHandle_Type, "Handle") < 0 || add_type(m, &CoreRequest_Type, "Request") < 0 ||
        add_type(m, &CorePending_Type, "Pending") < 0 || add_type(m, &CoreSubmitter_Type, "Submitter") < 0 ||
        add_type(m, &CoreLoneCycle_Type, "LoneCycle") < 0 || add_type(m, &CoreLock_Type, "Lock") < 0 ||
        add_type(m, &CoreEntry_Type, "Entry") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
