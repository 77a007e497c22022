"""The same endpoint with its requests batched the way people add batching to FastAPI: an
asyncio queue, and one task that encodes what has queued (up to 16) as one call."""

import asyncio

from _common import minilm_path
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(minilm_path(), device="cpu")
app = FastAPI()
queue: asyncio.Queue = asyncio.Queue()


class Req(BaseModel):
    text: str


async def batcher():
    while True:
        items = [await queue.get()]
        while len(items) < 16 and not queue.empty():
            items.append(queue.get_nowait())
        try:
            vecs = await asyncio.to_thread(model.encode, [text for text, _ in items])
            for (_, fut), vec in zip(items, vecs):
                fut.set_result(vec)
        except Exception as exc:
            for _, fut in items:
                fut.set_exception(exc)


@app.on_event("startup")
async def start():
    asyncio.get_running_loop().create_task(batcher())


@app.post("/embed")
async def embed(req: Req):
    fut = asyncio.get_running_loop().create_future()
    await queue.put((req.text, fut))
    return {"embedding": (await fut).tolist()}
