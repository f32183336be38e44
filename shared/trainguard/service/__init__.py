"""AWS adapters of the service: settings, clients, and the logic behind each handler."""


def reset() -> None:
    """Forget every per-process singleton (clients, services) — a warm Lambda keeps them;
    the local mode resets them when it starts or stops a local cloud."""
    from trainguard.service import clients, evaluate, notify

    clients.reset()
    evaluate.service.cache_clear()
    notify._once.cache_clear()
