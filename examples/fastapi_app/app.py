"""The FastAPI example's app: `uvicorn --factory examples.fastapi_app.app:create_app`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import Column, Integer, MetaData, Table, Text, insert, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

import worker.api
from worker import AsyncClient
from worker.db.embedded import database_url
from worker.settings import get_settings
from worker.urls import sqlalchemy_url

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("item", Text, nullable=False),
    Column("quantity", Integer, nullable=False),
)
stock = Table(
    "stock",
    metadata,
    Column("item", Text, primary_key=True),
    Column("units", Integer, nullable=False),
)


class OrderIn(BaseModel):
    id: int = Field(gt=0)
    item: str
    quantity: int = Field(gt=0)


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    """The request's session: what the endpoint does not commit rolls back at its end."""
    async with request.app.state.sessions() as s:
        yield s


Session = Annotated[AsyncSession, Depends(session)]


def create_app(url: str | None = None, token: str | None = None) -> FastAPI:
    """The shop's app on the database at `url` (by default `DATABASE_URL`, or the embedded
    server), with the job API mounted at `/worker`; its changes need the bearer `token` (by
    default `WORKER_API_TOKEN`; without one, only requests to a loopback host are served)."""
    url = url or database_url()
    engine = create_async_engine(sqlalchemy_url(url))
    jobs_api = worker.api.create_app(url, token or get_settings().api_token)

    @contextlib.asynccontextmanager
    async def shop_lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
            await conn.execute(
                text("INSERT INTO stock VALUES ('widget', 10) ON CONFLICT DO NOTHING")
            )
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        app.state.client = AsyncClient(url)
        try:
            yield
        finally:
            await app.state.client.close()
            await engine.dispose()

    # The mounted job API's lifespan runs first, then the shop's own.
    app = FastAPI(lifespan=worker.api.lifespan(jobs_api, then=shop_lifespan))
    app.mount("/worker", jobs_api)

    @app.post("/orders", status_code=201)
    async def place_order(order: OrderIn, session: Session, request: Request) -> dict[str, Any]:
        await session.execute(insert(orders).values(**order.model_dump()))
        client: AsyncClient = request.app.state.client
        job = await client.enqueue("ship_order", {"order": order.id}, connection=session)
        taken = await session.execute(
            update(stock)
            .where(stock.c.item == order.item, stock.c.units >= order.quantity)
            .values(units=stock.c.units - order.quantity)
        )
        if taken.rowcount == 0:  # type: ignore[attr-defined]
            # Nothing is committed: the order and its shipping job vanish together.
            raise HTTPException(409, f"not enough {order.item} in stock")
        await session.commit()
        return {"order": order.id, "job": job.job_id}

    return app
