"""python -m engine.checkpoint list|fetch NAME: the named real models and their cache
(catalog.main). Its own module, so that running it does not import the
catalog twice (the engine package, loaded first, already holds it)."""
import sys

from engine.checkpoint.catalog import main

sys.exit(main())
