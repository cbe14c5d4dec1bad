"""``from .receipts import send_receipt`` in docs/testing.md's views: "their
own app's" receipts, here a list of the charges whose receipt went out (in
order), in place of an e-mail or a queued task."""

sent_receipts: list[int] = []


def send_receipt(charge_id: int) -> None:
    sent_receipts.append(charge_id)
