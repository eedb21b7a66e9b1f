"""The hub token goes to the hub only: a file listing whose ``Link:
rel="next"`` points at another host is followed without it, as huggingface_hub does.
Two loopback hubs; the second is named ``localhost`` so its host differs."""

from __future__ import annotations

from pathlib import Path

from troupe.download.hubapi import HubClient, open_client
from troupe_rig.hub import open_hub, tiny_repo_files

MODEL = "m-Q4_K_M.gguf"


async def test_a_next_link_to_another_host_gets_no_token(tmp_path: Path) -> None:
    files = tiny_repo_files(tmp_path, MODEL, "README.md")
    with open_hub() as hub, open_hub() as other:
        hub.add_repo("org/private", files, private=True)
        other.add_repo("org/private", files)  # answers without a token: was one sent?
        hub.page_size = 1
        other.page_size = 1
        hub.next_base = other.url.replace("127.0.0.1", "localhost")
        async with open_client(hub.token, endpoint=hub.url) as client:
            plan = await HubClient(client, hub.url).plan("org/private")
        hub.wait_idle()  # a request is recorded once its answer is sent
        other.wait_idle()
        assert plan.repo == "org/private"
        assert hub.requests
        assert all(r.authorized for r in hub.requests)
        assert other.requests  # the next page was asked for there
        assert not any(r.authorized for r in other.requests)


async def test_the_token_still_reaches_the_hub_itself_on_every_page(tmp_path: Path) -> None:
    files = tiny_repo_files(tmp_path, MODEL, "README.md")
    with open_hub() as hub:
        hub.add_repo("org/private", files, private=True)
        hub.page_size = 1
        async with open_client(hub.token, endpoint=hub.url) as client:
            await HubClient(client, hub.url).plan("org/private")
        hub.wait_idle()  # a request is recorded once its answer is sent
        tree = [r for r in hub.requests if "/tree/" in r.path]
        assert len(tree) >= 2
        assert all(r.authorized for r in tree)
