from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

DEMO_USERS = (("alice", "alice-token"), ("bob", "bob-token"))
ADMIN = ("admin", "admin")


class Command(BaseCommand):
    help = "Create the demo users alice and bob (API tokens alice-token, bob-token) and an admin."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()  # noqa: N806
        for username, token in DEMO_USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.set_password(username)
            user.save()
            Token.objects.filter(user=user).exclude(key=token).delete()
            Token.objects.get_or_create(user=user, key=token)
            self.stdout.write(f"user {username!r}: password {username!r}, API token {token!r}")
        admin, _ = User.objects.get_or_create(username=ADMIN[0])
        admin.is_staff = admin.is_superuser = True
        admin.set_password(ADMIN[1])
        admin.save()
        self.stdout.write(f"superuser {ADMIN[0]!r}: password {ADMIN[1]!r} (admin at /admin/)")
