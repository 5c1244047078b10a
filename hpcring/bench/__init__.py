"""Benchmarks run as rank programs (`hpcring bench ...`); each module imports MPI only when it runs."""
