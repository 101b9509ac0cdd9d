"""The node installer (the DaemonSet's work and the .deb's engine step), one module per concern.

``main`` parses the command line and composes the steps: ``layout`` (versions and the ``current``
symlink), ``hooksd`` (hooks.d files), ``containerd`` (its runtime handlers), ``state`` (the record,
and the pass-throughs an uninstall leaves); ``node`` is the node's filesystem as they all see it.
"""
