import sys

from dashboard.client.cli import main

sys.exit(main())
