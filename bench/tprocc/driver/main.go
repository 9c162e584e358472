// tprocc: a TPROC-C-style driver (TPC-C's five transactions, no think time, as
// HammerDB's timed test). `gen` writes the initial population as CSV files;
// `run` drives N virtual users against one server for a warm-up and a
// measured period and prints one line of results.
//
// Three ways to send a transaction (-mode):
//
//	call  SELECT neword(…) etc.: the PL/pgSQL functions of procedures.sql,
//	      one statement per transaction (delegated on Tessera).
//	sql   the same statements sent one by one inside BEGIN … COMMIT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The constants C of the non-uniform random numbers (2.1.6): the run's C for
// last names differs from the load's by an allowed delta (2.1.6.1).
const (
	cLastLoad = 157
	cLastRun  = 223
	cCustomer = 259
	cItem     = 7911
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "tprocc:", err)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tprocc gen -dir DIR -warehouses N | tprocc run -url URL -warehouses N [-vus 8] [-warmup 10s] [-duration 60s] [-mode call|sql]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "gen":
		fs := flag.NewFlagSet("gen", flag.ExitOnError)
		dir := fs.String("dir", "", "directory for the CSV files")
		warehouses := fs.Int("warehouses", 10, "number of warehouses")
		seed := fs.Int64("seed", 1, "random seed")
		must(fs.Parse(os.Args[2:]))
		if *dir == "" {
			must(errors.New("gen needs -dir"))
		}
		generate(*dir, *warehouses, *seed)
	case "run":
		fs := flag.NewFlagSet("run", flag.ExitOnError)
		url := fs.String("url", "", "connection string")
		warehouses := fs.Int("warehouses", 10, "number of warehouses in the database")
		vus := fs.Int("vus", 8, "virtual users")
		warmup := fs.Duration("warmup", 10*time.Second, "time before measuring")
		duration := fs.Duration("duration", 60*time.Second, "measured time")
		mode := fs.String("mode", "call", "call or sql")
		must(fs.Parse(os.Args[2:]))
		if *mode != "call" && *mode != "sql" {
			must(errors.New("-mode takes call or sql"))
		}
		run(*url, *warehouses, *vus, *warmup, *duration, *mode == "call")
	default:
		must(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

// counters of the measured period.
type counters struct {
	newOrders, committed, rolledBack, failed atomic.Int64
}

func run(url string, warehouses, vus int, warmup, duration time.Duration, callMode bool) {
	ctx := context.Background()
	var measuring atomic.Bool
	var stop atomic.Bool
	var c counters
	var firstErrors sync.Map
	var wg sync.WaitGroup
	for vu := 0; vu < vus; vu++ {
		conn, err := pgx.Connect(ctx, url)
		must(err)
		t := &terminal{
			conn: conn, ctx: ctx, warehouses: warehouses,
			home:     vu%warehouses + 1,
			r:        rand.New(rand.NewSource(int64(vu) + time.Now().UnixNano())),
			callMode: callMode,
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(ctx)
			for !stop.Load() {
				kind, err := t.next()
				if !measuring.Load() {
					continue
				}
				switch {
				case err == nil:
					c.committed.Add(1)
					if kind == "new-order" {
						c.newOrders.Add(1)
					}
				case isInvalidItem(err):
					c.rolledBack.Add(1)
				default:
					c.failed.Add(1)
					firstErrors.LoadOrStore(kind+": "+err.Error(), true)
				}
			}
		}()
	}
	time.Sleep(warmup)
	measuring.Store(true)
	start := time.Now()
	time.Sleep(duration)
	measuring.Store(false)
	elapsed := time.Since(start).Minutes()
	stop.Store(true)
	wg.Wait()
	firstErrors.Range(func(k, _ any) bool {
		fmt.Fprintln(os.Stderr, "error:", k)
		return true
	})
	fmt.Printf("nopm=%.0f tpm=%.0f new_orders=%d committed=%d rolled_back=%d failed=%d\n",
		float64(c.newOrders.Load())/elapsed, float64(c.committed.Load()+c.rolledBack.Load())/elapsed,
		c.newOrders.Load(), c.committed.Load(), c.rolledBack.Load(), c.failed.Load())
}

// isInvalidItem: the 1% of new orders that roll back on purpose (2.4.1.4).
func isInvalidItem(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "P0002"
}

// terminal is one virtual user with its home warehouse.
type terminal struct {
	conn             *pgx.Conn
	ctx              context.Context
	warehouses, home int
	r                *rand.Rand
	callMode         bool
}

// next runs one transaction of the mix (2.4 to 2.8: 45/43/4/4/4) and says which.
func (t *terminal) next() (string, error) {
	switch n := t.r.Intn(100); {
	case n < 45:
		return "new-order", t.newOrder()
	case n < 88:
		return "payment", t.payment()
	case n < 92:
		return "order-status", t.orderStatus()
	case n < 96:
		return "delivery", t.delivery()
	default:
		return "stock-level", t.stockLevel()
	}
}

// otherWarehouse draws a warehouse other than home (the home one when alone).
func (t *terminal) otherWarehouse() int {
	if t.warehouses == 1 {
		return t.home
	}
	w := between(t.r, 1, t.warehouses-1)
	if w >= t.home {
		w++
	}
	return w
}

// customer picks by last name (60%) or by id; by name gives id 0.
func (t *terminal) customer() (int, string) {
	if t.r.Intn(100) < 60 {
		return 0, lastName(nurand(t.r, 255, cLastRun, 0, 999))
	}
	return nurand(t.r, 1023, cCustomer, 1, customersPerDist), ""
}

type orderLine struct{ item, supply, quantity int }

func (t *terminal) newOrder() error {
	d := between(t.r, 1, districtsPerWh)
	c := nurand(t.r, 1023, cCustomer, 1, customersPerDist)
	lines := make([]orderLine, between(t.r, 5, 15))
	remote := false
	for i := range lines {
		lines[i] = orderLine{nurand(t.r, 8191, cItem, 1, items), t.home, between(t.r, 1, 10)}
		if t.r.Intn(100) == 0 {
			lines[i].supply = t.otherWarehouse()
			remote = remote || lines[i].supply != t.home
		}
	}
	sort.Slice(lines, func(i, j int) bool {
		if lines[i].supply != lines[j].supply {
			return lines[i].supply < lines[j].supply
		}
		return lines[i].item < lines[j].item
	})
	if t.r.Intn(100) == 0 {
		lines[len(lines)-1].item = items + 1 // unused: the order rolls back
	}
	itemIDs, supplies, quantities := make([]int32, len(lines)), make([]int32, len(lines)), make([]int32, len(lines))
	for i, l := range lines {
		itemIDs[i], supplies[i], quantities[i] = int32(l.item), int32(l.supply), int32(l.quantity)
	}
	if t.callMode {
		var total float64
		return t.conn.QueryRow(t.ctx, "SELECT neword($1, $2, $3, $4, $5, $6)", t.home, d, c, itemIDs, supplies, quantities).Scan(&total)
	}
	return t.inTransaction(func(tx pgx.Tx) error {
		var wTax, dTax, discount float64
		var oID int
		if err := tx.QueryRow(t.ctx, "SELECT w_tax FROM warehouse WHERE w_id = $1", t.home).Scan(&wTax); err != nil {
			return err
		}
		if err := tx.QueryRow(t.ctx, `UPDATE district SET d_next_o_id = d_next_o_id + 1
			WHERE d_w_id = $1 AND d_id = $2 RETURNING d_next_o_id - 1, d_tax`, t.home, d).Scan(&oID, &dTax); err != nil {
			return err
		}
		if err := tx.QueryRow(t.ctx, "SELECT c_discount FROM customer WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3",
			t.home, d, c).Scan(&discount); err != nil {
			return err
		}
		allLocal := 1
		if remote {
			allLocal = 0
		}
		if _, err := tx.Exec(t.ctx, `INSERT INTO orders (o_w_id, o_d_id, o_id, o_c_id, o_entry_d, o_carrier_id, o_ol_cnt, o_all_local)
			VALUES ($1, $2, $3, $4, now(), NULL, $5, $6)`, t.home, d, oID, c, len(lines), allLocal); err != nil {
			return err
		}
		if _, err := tx.Exec(t.ctx, "INSERT INTO new_order (no_w_id, no_d_id, no_o_id) VALUES ($1, $2, $3)", t.home, d, oID); err != nil {
			return err
		}
		distColumn := fmt.Sprintf("s_dist_%02d", d)
		for i, l := range lines {
			var price string
			err := tx.QueryRow(t.ctx, "SELECT i_price::text FROM item WHERE i_id = $1", l.item).Scan(&price)
			if errors.Is(err, pgx.ErrNoRows) {
				return &pgconn.PgError{Code: "P0002", Message: fmt.Sprintf("item %d is not valid", l.item)}
			} else if err != nil {
				return err
			}
			var quantity int
			var distInfo string
			if err := tx.QueryRow(t.ctx, "SELECT s_quantity, "+distColumn+" FROM stock WHERE s_w_id = $1 AND s_i_id = $2 FOR UPDATE",
				l.supply, l.item).Scan(&quantity, &distInfo); err != nil {
				return err
			}
			quantity -= l.quantity
			if quantity < 10 {
				quantity += 91
			}
			remoteCount := 0
			if l.supply != t.home {
				remoteCount = 1
			}
			if _, err := tx.Exec(t.ctx, `UPDATE stock SET s_quantity = $3, s_ytd = s_ytd + $4, s_order_cnt = s_order_cnt + 1,
				s_remote_cnt = s_remote_cnt + $5 WHERE s_w_id = $1 AND s_i_id = $2`,
				l.supply, l.item, quantity, l.quantity, remoteCount); err != nil {
				return err
			}
			if _, err := tx.Exec(t.ctx, `INSERT INTO order_line (ol_w_id, ol_d_id, ol_o_id, ol_number, ol_i_id, ol_supply_w_id,
				ol_delivery_d, ol_quantity, ol_amount, ol_dist_info) VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $7::int * $8::numeric, $9)`,
				t.home, d, oID, i+1, l.item, l.supply, l.quantity, price, distInfo); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *terminal) payment() error {
	d := between(t.r, 1, districtsPerWh)
	cw, cd := t.home, d
	if t.r.Intn(100) < 15 {
		cw, cd = t.otherWarehouse(), between(t.r, 1, districtsPerWh)
	}
	c, last := t.customer()
	amount := fmt.Sprintf("%d.%02d", between(t.r, 1, 4999), between(t.r, 0, 99))
	if t.callMode {
		var balance float64
		return t.conn.QueryRow(t.ctx, "SELECT payment($1, $2, $3, $4, $5, $6, $7::numeric)", t.home, d, cw, cd, c, last, amount).Scan(&balance)
	}
	return t.inTransaction(func(tx pgx.Tx) error {
		var wName, dName, credit string
		if err := tx.QueryRow(t.ctx, "UPDATE warehouse SET w_ytd = w_ytd + $2::numeric WHERE w_id = $1 RETURNING w_name",
			t.home, amount).Scan(&wName); err != nil {
			return err
		}
		if err := tx.QueryRow(t.ctx, "UPDATE district SET d_ytd = d_ytd + $3::numeric WHERE d_w_id = $1 AND d_id = $2 RETURNING d_name",
			t.home, d, amount).Scan(&dName); err != nil {
			return err
		}
		if c == 0 {
			var err error
			if c, err = customerByName(t.ctx, tx, cw, cd, last); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(t.ctx, "SELECT c_credit FROM customer WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3 FOR UPDATE",
			cw, cd, c).Scan(&credit); err != nil {
			return err
		}
		var balance float64
		if err := tx.QueryRow(t.ctx, `UPDATE customer SET c_balance = c_balance - $4::numeric, c_ytd_payment = c_ytd_payment + $4::numeric,
			c_payment_cnt = c_payment_cnt + 1,
			c_data = CASE WHEN $5::text = 'BC'
			                THEN left(format('%s %s %s %s %s %s|', $3::int, $2::int, $1::int, $6::int, $7::int, $4::numeric) || c_data, 500)
			                ELSE c_data END
			WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3 RETURNING c_balance`,
			cw, cd, c, amount, credit, d, t.home).Scan(&balance); err != nil {
			return err
		}
		_, err := tx.Exec(t.ctx, `INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data)
			VALUES ($1, $2, $3, $4, $5, now(), $6::numeric, $7)`, c, cd, cw, d, t.home, amount, wName+"    "+dName)
		return err
	})
}

// customerByName is customer_by_name of procedures.sql in two statements.
func customerByName(ctx context.Context, tx pgx.Tx, w, d int, last string) (int, error) {
	var count, id int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM customer WHERE c_w_id = $1 AND c_d_id = $2 AND c_last = $3",
		w, d, last).Scan(&count); err != nil {
		return 0, err
	}
	err := tx.QueryRow(ctx, `SELECT c_id FROM customer WHERE c_w_id = $1 AND c_d_id = $2 AND c_last = $3
		ORDER BY c_first OFFSET $4 LIMIT 1`, w, d, last, (count-1)/2).Scan(&id)
	return id, err
}

func (t *terminal) orderStatus() error {
	d := between(t.r, 1, districtsPerWh)
	c, last := t.customer()
	if t.callMode {
		var lines int
		return t.conn.QueryRow(t.ctx, "SELECT ostat($1, $2, $3, $4)", t.home, d, c, last).Scan(&lines)
	}
	return t.inTransaction(func(tx pgx.Tx) error {
		if c == 0 {
			var err error
			if c, err = customerByName(t.ctx, tx, t.home, d, last); err != nil {
				return err
			}
		}
		var balance float64
		if err := tx.QueryRow(t.ctx, "SELECT c_balance FROM customer WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3",
			t.home, d, c).Scan(&balance); err != nil {
			return err
		}
		var oID int
		if err := tx.QueryRow(t.ctx, `SELECT o_id FROM orders WHERE o_w_id = $1 AND o_d_id = $2 AND o_c_id = $3
			ORDER BY o_id DESC LIMIT 1`, t.home, d, c).Scan(&oID); err != nil {
			return err
		}
		var lines int
		return tx.QueryRow(t.ctx, "SELECT count(*) FROM order_line WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id = $3",
			t.home, d, oID).Scan(&lines)
	})
}

func (t *terminal) delivery() error {
	carrier := between(t.r, 1, 10)
	if t.callMode {
		var delivered int
		return t.conn.QueryRow(t.ctx, "SELECT delivery($1, $2)", t.home, carrier).Scan(&delivered)
	}
	return t.inTransaction(func(tx pgx.Tx) error {
		for d := 1; d <= districtsPerWh; d++ {
			var oID, cID int
			err := tx.QueryRow(t.ctx, `SELECT no_o_id FROM new_order WHERE no_w_id = $1 AND no_d_id = $2
				ORDER BY no_o_id LIMIT 1 FOR UPDATE`, t.home, d).Scan(&oID)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			} else if err != nil {
				return err
			}
			if _, err := tx.Exec(t.ctx, "DELETE FROM new_order WHERE no_w_id = $1 AND no_d_id = $2 AND no_o_id = $3",
				t.home, d, oID); err != nil {
				return err
			}
			if err := tx.QueryRow(t.ctx, `UPDATE orders SET o_carrier_id = $4 WHERE o_w_id = $1 AND o_d_id = $2 AND o_id = $3
				RETURNING o_c_id`, t.home, d, oID, carrier).Scan(&cID); err != nil {
				return err
			}
			if _, err := tx.Exec(t.ctx, "UPDATE order_line SET ol_delivery_d = now() WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id = $3",
				t.home, d, oID); err != nil {
				return err
			}
			var amount string
			if err := tx.QueryRow(t.ctx, "SELECT sum(ol_amount)::text FROM order_line WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id = $3",
				t.home, d, oID).Scan(&amount); err != nil {
				return err
			}
			if _, err := tx.Exec(t.ctx, `UPDATE customer SET c_balance = c_balance + $4::numeric, c_delivery_cnt = c_delivery_cnt + 1
				WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3`, t.home, d, cID, amount); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *terminal) stockLevel() error {
	d := between(t.r, 1, districtsPerWh)
	threshold := between(t.r, 10, 20)
	if t.callMode {
		var low int
		return t.conn.QueryRow(t.ctx, "SELECT slev($1, $2, $3)", t.home, d, threshold).Scan(&low)
	}
	return t.inTransaction(func(tx pgx.Tx) error {
		var next, low int
		if err := tx.QueryRow(t.ctx, "SELECT d_next_o_id FROM district WHERE d_w_id = $1 AND d_id = $2", t.home, d).Scan(&next); err != nil {
			return err
		}
		return tx.QueryRow(t.ctx, `SELECT count(DISTINCT s_i_id) FROM order_line JOIN stock ON s_w_id = ol_w_id AND s_i_id = ol_i_id
			WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id >= $3 - 20 AND ol_o_id < $3 AND s_quantity < $4`,
			t.home, d, next, threshold).Scan(&low)
	})
}

// inTransaction runs body inside BEGIN … COMMIT, rolling back on its error.
func (t *terminal) inTransaction(body func(pgx.Tx) error) error {
	tx, err := t.conn.Begin(t.ctx)
	if err != nil {
		return err
	}
	if err := body(tx); err != nil {
		_ = tx.Rollback(t.ctx)
		return err
	}
	return tx.Commit(t.ctx)
}
