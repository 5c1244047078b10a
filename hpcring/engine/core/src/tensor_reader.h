/* The interface between the core (C, not linked against torch) and the optional torch reader (C++, built
 * against the installed torch): one function, handed over in a PyCapsule, that reads what the submit needs
 * of a tensor through torch's C++ API instead of seven calls into torch's Python bindings. */
#ifndef HPCRING_TENSOR_READER_H
#define HPCRING_TENSOR_READER_H

#include <stdint.h>

#define CORE_READER_CAPSULE "hpcring.engine.core._torch_reader.read_tensor"
#define CORE_READER_MAXDIMS 32 /* numpy 1's limit; a tensor with more takes the Python path */

typedef struct {
    void *data;
    int ndim;
    int scalar_type; /* c10::ScalarType's value; the core maps it through its own table */
    int64_t dims[CORE_READER_MAXDIMS];
} CoreTensorFields;

/* 1 and `out` filled for a dense, contiguous, non-empty CPU tensor that needs no gradient, of the exact
 * type torch.Tensor (or Parameter); 0 for anything else, and never an error or a C++ exception: the core
 * then asks the tensor's Python attributes, whose errors the Python path words. The GIL is held. */
typedef int (*core_read_tensor_fn)(PyObject *tensor, CoreTensorFields *out);

#endif
