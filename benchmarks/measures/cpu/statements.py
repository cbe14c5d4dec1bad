"""The SQL statements and Redis commands one request of each control route sends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def print_statements(names: list[str], call: Callable[[str], None]) -> None:
    from django.db import connection
    from redis import connection as redis_connection

    connection_class: Any = redis_connection.Connection  # patched below, then restored
    sent: list[str] = []
    real_send = connection_class.send_packed_command
    real_pack = connection_class.pack_commands

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(" ".join(sql.split())[:110])
        return execute(sql, params, many, context)

    def pack_commands(self: Any, commands: Any) -> Any:
        sent.append("redis pipeline: " + " ".join(str(c[0]) for c in commands))
        return real_pack(self, commands)

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
        if isinstance(command, bytes) or (isinstance(command, list) and len(command) == 1):
            head = command if isinstance(command, bytes) else command[0]
            sent.append("redis: " + bytes(head)[:60].decode(errors="replace").split("\r\n")[2])
        return real_send(self, command, check_health)

    connection_class.send_packed_command = send_packed_command
    connection_class.pack_commands = pack_commands
    try:
        for name in names:
            sent.clear()
            with connection.execute_wrapper(wrapper):
                call(name)
            print(f"{name}: {len(sent)} statements and commands")
            for line in sent:
                print("   ", line)
    finally:
        connection_class.send_packed_command = real_send
        connection_class.pack_commands = real_pack
