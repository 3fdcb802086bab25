import sys

from trainyard.cli import main

sys.exit(main())
