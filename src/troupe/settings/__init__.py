"""Router settings: llama-server's option table, the command line, the config file."""
