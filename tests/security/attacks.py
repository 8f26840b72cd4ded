"""Attack code run inside the sandbox by the security tests (plain Python source)."""
from __future__ import annotations

import textwrap


def pg_write(socket_path: str | None, host: str | None, database: str, table: str,
             port: int = 5432) -> str:
    """Python source that talks Postgres' wire protocol (trust auth, as the machine's
    Postgres allows) over a Unix socket or TCP and creates `table` in `database` (a write
    that does not depend on the schema). Prints "written" if the server did it, else how
    it was stopped."""
    return textwrap.dedent(f"""
        import socket, struct
        def msg(kind, body):
            return kind + struct.pack("!I", len(body) + 4) + body
        try:
            if {socket_path!r}:
                s = socket.socket(socket.AF_UNIX)
                s.connect({socket_path!r})
            else:
                s = socket.create_connection(({host!r}, {port}), timeout=5)
            params = b"user\\0postgres\\0database\\0" + {database!r}.encode() + b"\\0\\0"
            body = struct.pack("!I", 196608) + params
            s.sendall(struct.pack("!I", len(body) + 4) + body)
            sql = "CREATE TABLE {table} (i int)"
            s.sendall(msg(b"Q", sql.encode() + b"\\0"))
            seen = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                seen += chunk
                if b"CREATE TABLE" in seen or b"ERROR" in seen or b"FATAL" in seen:
                    break
            print("written" if b"CREATE TABLE" in seen else "refused: " + repr(seen[-200:]))
        except OSError as exc:
            print("blocked:", type(exc).__name__, exc.errno)
    """)
