"""Contracts between the launcher and the ranks (environment variables, exit codes, notices): neutral
modules that neither side has to reach up for. They import nothing of hpcring but `errors`."""
