"""The offline generation job's parts: input/output (io), resume, per-record errors, runtimes."""
