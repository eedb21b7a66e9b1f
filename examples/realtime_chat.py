"""Talk to a local model over troupe's /v1/realtime with the official openai SDK.

pip install 'openai[realtime]'
scripts/demo                      # troupe on 127.0.0.1:8080 with Gemma 3 270M
python examples/realtime_chat.py  # then type; an empty line quits
"""

import asyncio

from openai import AsyncOpenAI


async def main() -> None:
    client = AsyncOpenAI(base_url="http://127.0.0.1:8080/v1", api_key="none")  # key: --api-key
    async with client.realtime.connect(model="gemma-3-270m") as conn:
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        while question := await asyncio.to_thread(input, "you: "):
            content = [{"type": "input_text", "text": question}]
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": content}
            )
            await conn.response.create(response={"max_output_tokens": 200})
            async for event in conn:
                if event.type == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                elif event.type == "error":
                    print(f"[error: {event.error.message}]")
                elif event.type == "response.done":
                    print()
                    break


asyncio.run(main())
