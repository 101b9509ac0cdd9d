"""Node tools: installer, containerd configs, doctor, log reader, CLI commands. May import any
layer below the CLI."""
