"""`python -m tfgpu` runs the `tfgpu` command."""

import sys

from tfgpu.cli import main

sys.exit(main())
