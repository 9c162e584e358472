-- TPC-C consistency conditions 1 to 4 (clause 3.3.2): each query lists the
-- warehouses or districts that break one; a consistent database gives no rows.
SELECT 'condition 1: w_ytd = sum(d_ytd)' AS broken, w_id AS w, NULL::int AS d
  FROM warehouse JOIN (SELECT d_w_id, sum(d_ytd) AS ytd FROM district GROUP BY d_w_id) d ON d_w_id = w_id
 WHERE w_ytd <> ytd
UNION ALL
SELECT 'condition 2: d_next_o_id - 1 = max(o_id) = max(no_o_id)', d_w_id, d_id
  FROM district
  JOIN (SELECT o_w_id, o_d_id, max(o_id) AS max_o FROM orders GROUP BY o_w_id, o_d_id) o
    ON o_w_id = d_w_id AND o_d_id = d_id
  LEFT JOIN (SELECT no_w_id, no_d_id, max(no_o_id) AS max_no FROM new_order GROUP BY no_w_id, no_d_id) n
    ON no_w_id = d_w_id AND no_d_id = d_id
 WHERE d_next_o_id - 1 <> max_o OR (max_no IS NOT NULL AND max_no <> max_o)
UNION ALL
SELECT 'condition 3: max(no_o_id) - min(no_o_id) + 1 = count(new_order)', no_w_id, no_d_id
  FROM new_order GROUP BY no_w_id, no_d_id
HAVING max(no_o_id) - min(no_o_id) + 1 <> count(*)
UNION ALL
SELECT 'condition 4: sum(o_ol_cnt) = count(order_line)', o_w_id, o_d_id
  FROM (SELECT o_w_id, o_d_id, sum(o_ol_cnt) AS lines FROM orders GROUP BY o_w_id, o_d_id) o
  JOIN (SELECT ol_w_id, ol_d_id, count(*) AS lines FROM order_line GROUP BY ol_w_id, ol_d_id) l
    ON ol_w_id = o_w_id AND ol_d_id = o_d_id
 WHERE o.lines <> l.lines
ORDER BY 1, 2, 3;
