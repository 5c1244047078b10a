"""Allreduce algorithms (native, ring, hierarchical): pure functions over a `Transport`, never over mpi4py."""
