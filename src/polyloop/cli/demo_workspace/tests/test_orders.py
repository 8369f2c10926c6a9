import unittest

from shop.orders import OrderError, Shop


class CancelOrderTest(unittest.TestCase):
    def setUp(self) -> None:
        self.shop = Shop(stock={"apple": 5})

    def test_cancel_marks_the_order_cancelled(self) -> None:
        order = self.shop.place_order("apple", 2)
        self.assertEqual(self.shop.cancel_order(order.order_id).status, "cancelled")

    def test_cancel_returns_the_items_to_stock(self) -> None:
        order = self.shop.place_order("apple", 2)
        self.shop.cancel_order(order.order_id)
        self.assertEqual(self.shop.stock["apple"], 5)

    def test_a_shipped_order_cannot_be_cancelled(self) -> None:
        order = self.shop.place_order("apple", 1)
        self.shop.ship_order(order.order_id)
        with self.assertRaises(OrderError):
            self.shop.cancel_order(order.order_id)


class PlaceOrderTest(unittest.TestCase):
    def test_stock_is_reserved(self) -> None:
        shop = Shop(stock={"pear": 3})
        shop.place_order("pear", 3)
        self.assertEqual(shop.stock["pear"], 0)
        with self.assertRaises(OrderError):
            shop.place_order("pear", 1)


if __name__ == "__main__":
    unittest.main()
