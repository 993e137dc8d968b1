import sys

from vlmcp.cli import main

sys.exit(main())
