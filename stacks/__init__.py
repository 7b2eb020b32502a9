"""The CDK app of Bedrock Price Keeper.

The stacks build the deployed system from the same definitions the runtime uses
(``price_keeper.store.tables`` and ``price_keeper.routes``), so this package puts the shared
layer's source on ``sys.path`` before anything imports it.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LAYER_DIR = REPO_ROOT / "layers" / "common"
LAYER_SOURCE = LAYER_DIR / "python"
LAMBDAS_DIR = REPO_ROOT / "lambdas"

if str(LAYER_SOURCE) not in sys.path:
    sys.path.insert(0, str(LAYER_SOURCE))
