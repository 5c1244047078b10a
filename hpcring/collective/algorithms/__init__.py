"""Allreduce algorithms (native, ring, hierarchical over a `Transport`, never over mpi4py; shm over a node's
shared-memory segment)."""
