package main

// The initial population of TPC-C (clause 4.3.3), written as one CSV file per
// table for `tessera load` and COPY.

import (
	"bufio"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"time"
)

const (
	items             = 100000
	districtsPerWh    = 10
	customersPerDist  = 3000
	ordersPerDist     = 3000
	firstNewOrder     = 2101 // orders from here on are undelivered at load time
	lastNameRangeLoad = 1000
)

var syllables = []string{"BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"}

// lastName spells a number from 0 to 999 with three syllables (4.3.2.3).
func lastName(n int) string {
	return syllables[n/100] + syllables[n/10%10] + syllables[n%10]
}

// nurand is TPC-C's non-uniform random number (2.1.6).
func nurand(r *rand.Rand, a, c, x, y int) int {
	return ((between(r, 0, a)|between(r, x, y))+c)%(y-x+1) + x
}

func between(r *rand.Rand, lo, hi int) int { return lo + r.Intn(hi-lo+1) }

const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func astring(r *rand.Rand, lo, hi int) string {
	b := make([]byte, between(r, lo, hi))
	for i := range b {
		b[i] = letters[r.Intn(len(letters))]
	}
	return string(b)
}

func nstring(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + r.Intn(10))
	}
	return string(b)
}

// withOriginal puts "ORIGINAL" into 10% of item and stock data (4.3.3.1).
func withOriginal(r *rand.Rand, s string) string {
	if r.Intn(10) != 0 || len(s) < 8 {
		return s
	}
	at := r.Intn(len(s) - 7)
	return s[:at] + "ORIGINAL" + s[at+8:]
}

func zip(r *rand.Rand) string { return nstring(r, 4) + "11111" }

type csvFile struct {
	f *os.File
	w *bufio.Writer
}

func createCSV(dir, table string) *csvFile {
	f, err := os.Create(filepath.Join(dir, table+".csv"))
	must(err)
	return &csvFile{f, bufio.NewWriterSize(f, 1<<20)}
}

func (c *csvFile) row(format string, args ...any) {
	_, err := fmt.Fprintf(c.w, format+"\n", args...)
	must(err)
}

func (c *csvFile) close() {
	must(c.w.Flush())
	must(c.f.Close())
}

// generate writes the population of `warehouses` warehouses into dir.
func generate(dir string, warehouses int, seed int64) {
	must(os.MkdirAll(dir, 0o755))
	r := rand.New(rand.NewSource(seed))
	now := time.Now().UTC().Format("2006-01-02 15:04:05")

	item := createCSV(dir, "item")
	for i := 1; i <= items; i++ {
		item.row("%d,%d,%s,%d.%02d,%s", i, between(r, 1, 10000), astring(r, 14, 24),
			between(r, 1, 99), between(r, 0, 99), withOriginal(r, astring(r, 26, 50)))
	}
	item.close()

	tables := map[string]*csvFile{}
	for _, t := range []string{"warehouse", "district", "customer", "history", "orders", "new_order", "order_line", "stock"} {
		tables[t] = createCSV(dir, t)
	}
	for w := 1; w <= warehouses; w++ {
		tables["warehouse"].row("%d,%s,%s,%s,%s,%s,%s,0.%04d,300000.00", w, astring(r, 6, 10),
			astring(r, 10, 20), astring(r, 10, 20), astring(r, 10, 20), astring(r, 2, 2), zip(r), between(r, 0, 2000))
		for i := 1; i <= items; i++ {
			dists := make([]any, 10)
			for k := range dists {
				dists[k] = astring(r, 24, 24)
			}
			tables["stock"].row("%d,%d,%d,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,0,0,0,%s", append(append([]any{w, i, between(r, 10, 100)},
				dists...), withOriginal(r, astring(r, 26, 50)))...)
		}
		for d := 1; d <= districtsPerWh; d++ {
			tables["district"].row("%d,%d,%s,%s,%s,%s,%s,%s,0.%04d,30000.00,%d", w, d, astring(r, 6, 10),
				astring(r, 10, 20), astring(r, 10, 20), astring(r, 10, 20), astring(r, 2, 2), zip(r),
				between(r, 0, 2000), ordersPerDist+1)
			for c := 1; c <= customersPerDist; c++ {
				last := lastName(nurand(r, 255, cLastLoad, 0, 999))
				if c <= lastNameRangeLoad {
					last = lastName(c - 1)
				}
				credit := "GC"
				if r.Intn(10) == 0 {
					credit = "BC"
				}
				tables["customer"].row("%d,%d,%d,%s,OE,%s,%s,%s,%s,%s,%s,%s,%s,%s,50000.00,0.%04d,-10.00,10.00,1,0,%s",
					w, d, c, astring(r, 8, 16), last, astring(r, 10, 20), astring(r, 10, 20), astring(r, 10, 20),
					astring(r, 2, 2), zip(r), nstring(r, 16), now, credit, between(r, 0, 5000), astring(r, 300, 500))
				tables["history"].row("%d,%d,%d,%d,%d,%s,10.00,%s", c, d, w, d, w, now, astring(r, 12, 24))
			}
			// Each customer places exactly one of the district's initial orders.
			customers := r.Perm(customersPerDist)
			for o := 1; o <= ordersPerDist; o++ {
				lines := between(r, 5, 15)
				carrier := fmt.Sprint(between(r, 1, 10))
				delivered := now
				if o >= firstNewOrder {
					carrier, delivered = "", ""
					tables["new_order"].row("%d,%d,%d", w, d, o)
				}
				tables["orders"].row("%d,%d,%d,%d,%s,%s,%d,1", w, d, o, customers[o-1]+1, now, carrier, lines)
				for l := 1; l <= lines; l++ {
					amount := "0.00"
					if o >= firstNewOrder {
						amount = fmt.Sprintf("%d.%02d", between(r, 0, 9999), between(r, 0, 99))
					}
					tables["order_line"].row("%d,%d,%d,%d,%d,%d,%s,5,%s,%s", w, d, o, l, between(r, 1, items), w,
						delivered, amount, astring(r, 24, 24))
				}
			}
		}
	}
	for _, t := range tables {
		t.close()
	}
}
