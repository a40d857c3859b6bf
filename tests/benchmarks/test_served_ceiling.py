"""benchmarks/served_ceiling.py's arithmetic: a group's cost between measured batch shapes and
the cheapest cut of a round of texts into padded groups.  No engine runs here."""
import pytest
from script_loader import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/served_ceiling.py")


def test_the_cheapest_split_pays_the_overhead_only_where_padding_costs_more(bench):
    def cost(rows, width):
        return 5 + rows * width

    # one group: 5 + 3*10 = 35; {1,1} {10}: 7 + 15 = 22; every text alone: 6 + 6 + 15 = 27
    assert bench.best_split_cost([10, 1, 1], cost) == 22
    # equal lengths: one group is cheapest (one overhead)
    assert bench.best_split_cost([4, 4, 4, 4], cost) == 5 + 16
    # a huge overhead: never split
    assert bench.best_split_cost([1, 9], lambda r, w: 100 + r * w) == 100 + 18


def test_costs_between_measured_shapes_are_interpolated(bench):
    times = {(1, 16): 1.0, (1, 64): 4.0, (4, 16): 2.0, (4, 64): 8.0}
    cost = bench.interpolated_cost(times)
    assert [cost(r, w) for r, w in times] == list(times.values())  # exact on the grid
    assert cost(1, 40) == pytest.approx(2.5)  # halfway in width
    assert cost(2.5, 16) == pytest.approx(1.5)  # halfway in rows
    assert cost(2.5, 40) == pytest.approx((2.5 + 5.0) / 2)
    assert cost(8, 64) == pytest.approx(16.0)  # past the largest rows: proportional


def test_a_grid_prices_each_group_at_the_shape_it_is_padded_up_to(bench):
    grid = bench.parse_grid("4,1:64,16")
    assert grid == ((1, 4), (16, 64))
    priced = bench.on_grid(lambda r, w: r * w, grid)
    assert priced(3, 20) == 4 * 64 and priced(1, 16) == 16
    assert priced(5, 10) is None and priced(1, 65) is None  # past the grid: not formed
    # three texts of 10 tokens: one group of 4 x 16 rows costs 64, three of 1 x 16 cost 48
    assert bench.best_split_cost([10, 10, 10], priced) == 48
    with pytest.raises(Exception, match="ROWS:WIDTHS"):
        bench.parse_grid("1,4,16")
