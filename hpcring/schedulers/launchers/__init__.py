"""Launchers (srun, jsrun, mpirun, mpiexec, flux run): RankMap -> argv and the files they read; `registry`
finds them by name."""
