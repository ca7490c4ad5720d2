import gc
import sys

gc.disable()  # for the imports too: see hubd.cli.main

from hubd.cli import main  # noqa: E402

sys.exit(main())
