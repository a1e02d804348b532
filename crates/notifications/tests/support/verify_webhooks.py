"""Verifies webhooks that pagamentos notificacoes really sent, with the Standard Webhooks
reference library (`standardwebhooks` from PyPI), not with our own code.

Usage: verify_webhooks.py DELIVERIES.json SECRET

DELIVERIES.json is a list of {"headers": {name: value}, "body": text}. Every delivery must
verify; the same delivery with its body changed, with its timestamp moved 10 minutes back, or
checked with another secret must be refused. Prints one line per check; exit 0 only if all
held.
"""

import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def refused(webhook, body, headers):
    try:
        webhook.verify(body, headers)
    except WebhookVerificationError as error:
        return str(error)
    return None


def main():
    deliveries = json.load(open(sys.argv[1], encoding="utf-8"))
    webhook = Webhook(sys.argv[2])
    other = Webhook("whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB")
    failures = []
    for number, delivery in enumerate(deliveries):
        headers, body = delivery["headers"], delivery["body"]
        why = refused(webhook, body, headers)
        if why is not None:
            failures.append(f"delivery {number}: refused: {why}")
            continue
        print(f"delivery {number}: verified ({headers['webhook-id']})")
        if refused(webhook, body + " ", headers) is None:
            failures.append(f"delivery {number}: a tampered body verified")
        stale = dict(headers, **{"webhook-timestamp": str(int(headers["webhook-timestamp"]) - 600)})
        why = refused(webhook, body, stale)
        if why is None or "too old" not in why:
            failures.append(f"delivery {number}: a 10-minute-old timestamp was not refused as too old: {why}")
        if refused(other, body, headers) is None:
            failures.append(f"delivery {number}: verified with another secret")
    for failure in failures:
        print(failure)
    print(f"{len(deliveries)} deliveries, {len(failures)} failures")
    sys.exit(1 if failures or not deliveries else 0)


main()
