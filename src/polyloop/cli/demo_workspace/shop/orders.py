"""A tiny order service: place orders against stock, cancel them, ship them."""

from __future__ import annotations

from dataclasses import dataclass, field


class OrderError(Exception):
    """An order operation that is not allowed."""


@dataclass
class Order:
    order_id: int
    item: str
    quantity: int
    status: str = "placed"  # placed -> shipped, or placed -> cancelled


@dataclass
class Shop:
    stock: dict[str, int]
    orders: dict[int, Order] = field(default_factory=dict)
    _next_id: int = 1

    def place_order(self, item: str, quantity: int) -> Order:
        if quantity <= 0:
            raise OrderError("quantity must be positive")
        if self.stock.get(item, 0) < quantity:
            raise OrderError(f"not enough {item} in stock")
        self.stock[item] -= quantity
        order = Order(self._next_id, item, quantity)
        self.orders[order.order_id] = order
        self._next_id += 1
        return order

    def ship_order(self, order_id: int) -> Order:
        order = self.orders[order_id]
        if order.status != "placed":
            raise OrderError(f"order {order_id} is {order.status}")
        order.status = "shipped"
        return order

    def cancel_order(self, order_id: int) -> Order:
        order = self.orders[order_id]
        order.status = "cancelled"
        return order
