"""No models yet: later issues add them."""
from __future__ import annotations
