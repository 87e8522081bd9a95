"""``python -m dmlstudy`` (and ``torchrun -m dmlstudy``) = the ``dmlstudy`` command."""

import sys

from dmlstudy.cli import main

sys.exit(main())
