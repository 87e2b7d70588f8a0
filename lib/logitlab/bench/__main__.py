"""``python -m logitlab.bench``"""

from .run import main

main()
