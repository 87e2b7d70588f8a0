"""``python -m logitlab.course``: see :mod:`logitlab.course.run`."""

import sys

from .run import main

main(sys.argv[1:])
