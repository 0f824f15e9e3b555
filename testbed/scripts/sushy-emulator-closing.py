"""sushy-emulator, with its SQLite connections closed when each use ends.

sushy-tools keeps emulated state (the fake driver's systems, indicators, ...) in SQLite
through `memoize.PersistentDict`, which opens a connection per access and leaves it to be
closed when the object is freed. On Python 3.11 a connection sits in a reference cycle, so
it is freed only by the cycle collector: under a few hundred concurrent requests the
emulator reached its 20,000 file descriptors within seconds and answered HTTP 500 to
everything after. The bench's provider run (1,000 emulated systems) starts the emulator
through this file instead; the emulator's behaviour is otherwise unchanged.

    python sushy-emulator-closing.py --config FILE --interface ADDR --port PORT
"""

import contextlib
import sqlite3
import sys

from sushy_tools.emulator import memoize


@contextlib.contextmanager
def _closing_connection(self):
    if not self._dbpath:
        raise TypeError('Dict is not yet persistent')
    connection = sqlite3.connect(self._dbpath)
    try:
        with connection:  # commits, or rolls back on an exception
            connection.execute('pragma journal_mode=wal')
            yield connection.cursor()
    finally:
        connection.close()


memoize.PersistentDict.connection = _closing_connection

from sushy_tools.emulator.main import main  # noqa: E402 (after the patch)

sys.exit(main())
