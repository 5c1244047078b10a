"""`hpcring run` in elastic mode: a driver that relaunches the job on the hosts left (or added).

MPI cannot shrink or grow a running world, so a world that must change size is ended and started again; the
workers' state survives in node-local memory (`hpcring.torch.elastic`'s commit store). See
docs/guide/elastic.md. Nothing here imports torch or MPI.
"""
