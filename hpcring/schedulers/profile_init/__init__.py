"""`hpcring profiles init`: write a profile (schema v2) for the cluster this command runs on.

One small parser per source (pure functions: the text a tool printed in, facts out), a prober that runs the
tools with timeouts (a missing tool means the fact is unknown) or reads their recorded outputs, and a writer
that turns the facts into commented YAML. What no source can tell (reserved cores, walltime limits a site does
not publish, the interconnect of a Slingshot or RoCE fabric) is left as a commented placeholder, and the file
still validates.
"""
