"""Child processes: the llama-server protocol, spawning, the stop ladder, the PID ledger."""
