import sys

from trainyard_client.cli import main

sys.exit(main())
