"""Launchers (srun, jsrun, mpirun): RankMap -> argv and the files they read. Each module registers itself."""
