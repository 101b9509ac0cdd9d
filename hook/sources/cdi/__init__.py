"""CDI (Container Device Interface): spec parsing, the registry, and container edits, read from the spec dirs.

Rule: specs are validated once, at load; requests resolve all-or-nothing; applying edits is
pure. Import the submodules directly (``hook.core.cdinames`` is a pure leaf with no I/O).
"""
