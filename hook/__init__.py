"""oci-device-hook: an OCI runtime hook that keeps GPU device access honest (README.md).

``STARTED`` is the monotonic clock when the hook's first module was imported (the interpreter's
own start-up is before it): the log line's ``duration_ms`` counts from here. ``time`` is built
into the interpreter and already loaded, so this costs the start path nothing.
"""

import time as _time

STARTED = _time.monotonic()
