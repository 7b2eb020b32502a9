"""The local stack (``make run``): API Gateway, DynamoDB, Bedrock's inference profiles and
EventBridge played on one machine. Importing the package puts the shared layer on
``sys.path``, as Lambda puts a layer under /opt/python, before any module of it runs."""

import sys
from pathlib import Path

LAYER = Path(__file__).resolve().parent.parent / "layers" / "common" / "python"
if str(LAYER) not in sys.path:
    sys.path.insert(0, str(LAYER))
