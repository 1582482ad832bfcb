"""The database's defaults, light to import (the command line's help reads them)."""

DB_MAX_BYTES = 4 * 2**30  # all traces in the database together, as JSON; the oldest unpinned go first
