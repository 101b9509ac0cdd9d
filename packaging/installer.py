# oci-device-hook installer (Python part), run by ./installer beside it: on the bundled interpreter,
# or on the node's python3 for a package built without one. Same isolation as the launcher; see
# hook/tools/install/.
import os
import sys

if sys.version_info < (3, 11):
    sys.stderr.write(
        "oci-device-hook: the installer needs Python >= 3.11; %s is %d.%d\n"
        % (sys.executable, sys.version_info[0], sys.version_info[1])
    )
    sys.exit(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "lib"))

from hook.tools.install.main import main  # noqa: E402

sys.exit(main())
