"""Schemathesis hooks for tests/server/schema.sh (loaded through SCHEMATHESIS_HOOKS).

The generated requests are arbitrary members of OpenAI's request schemas; on a CPU the
generation they ask for must stay short for the run to end in a few minutes. Each
generated body (map_body) and each body about to be sent (before_call) is capped: a
numeric `max_tokens` / `max_completion_tokens` above CAP, or none at all, becomes CAP, and
a numeric `n` above N_CAP becomes N_CAP. Values of the wrong type or below the range are
left alone, so negative cases stay negative.
"""
import schemathesis

CAP = 4
N_CAP = 2


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def cap(body):
    if not isinstance(body, dict):
        return body
    limits = [k for k in ("max_tokens", "max_completion_tokens") if k in body]
    if not limits:
        body["max_tokens"] = CAP
    for k in limits:
        if _number(body[k]) and body[k] > CAP:
            body[k] = CAP
    if _number(body.get("n")) and body["n"] > N_CAP:
        body["n"] = N_CAP
    return body


@schemathesis.hook
def map_body(context, body):
    return cap(body)


@schemathesis.hook
def before_call(context, case, kwargs):
    cap(case.body)
