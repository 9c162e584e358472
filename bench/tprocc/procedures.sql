-- The five TPROC-C transactions as PL/pgSQL functions, written from the TPC-C
-- specification (clauses 2.4 to 2.8). The driver draws the inputs (so that it
-- knows which calls touch another warehouse) and passes them in; every
-- function takes its home warehouse first, the argument Tessera delegates by.
-- driver/main.go sends the same statements one by one for the baseline that
-- runs without these functions: keep the two in step.

-- New-Order (2.4): the order lines arrive sorted by (supply warehouse, item),
-- so that concurrent orders lock stock rows in one order. An unknown item
-- (the 1% the driver asks for on purpose) rolls the whole order back.
CREATE FUNCTION neword(p_w_id int, p_d_id int, p_c_id int,
                       p_item_ids int[], p_supply_w_ids int[], p_quantities int[])
RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    v_ol_cnt int := cardinality(p_item_ids);
    v_all_local int;
    v_w_tax numeric;
    v_d_tax numeric;
    v_o_id int;
    v_discount numeric;
    v_price numeric;
    v_s_quantity int;
    v_dist_info text;
    v_amount numeric;
    v_total numeric := 0;
BEGIN
    SELECT w_tax INTO v_w_tax FROM warehouse WHERE w_id = p_w_id;
    UPDATE district SET d_next_o_id = d_next_o_id + 1
     WHERE d_w_id = p_w_id AND d_id = p_d_id
    RETURNING d_next_o_id - 1, d_tax INTO v_o_id, v_d_tax;
    SELECT c_discount INTO v_discount FROM customer
     WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_id = p_c_id;
    v_all_local := CASE WHEN p_w_id = ALL (p_supply_w_ids) THEN 1 ELSE 0 END;
    INSERT INTO orders (o_w_id, o_d_id, o_id, o_c_id, o_entry_d, o_carrier_id, o_ol_cnt, o_all_local)
    VALUES (p_w_id, p_d_id, v_o_id, p_c_id, now(), NULL, v_ol_cnt, v_all_local);
    INSERT INTO new_order (no_w_id, no_d_id, no_o_id) VALUES (p_w_id, p_d_id, v_o_id);
    FOR i IN 1 .. v_ol_cnt LOOP
        SELECT i_price INTO v_price FROM item WHERE i_id = p_item_ids[i];
        IF NOT FOUND THEN
            RAISE EXCEPTION 'item % is not valid', p_item_ids[i] USING ERRCODE = 'no_data_found';
        END IF;
        SELECT s_quantity,
               CASE p_d_id WHEN 1 THEN s_dist_01 WHEN 2 THEN s_dist_02 WHEN 3 THEN s_dist_03
                           WHEN 4 THEN s_dist_04 WHEN 5 THEN s_dist_05 WHEN 6 THEN s_dist_06
                           WHEN 7 THEN s_dist_07 WHEN 8 THEN s_dist_08 WHEN 9 THEN s_dist_09
                           ELSE s_dist_10 END
          INTO v_s_quantity, v_dist_info
          FROM stock WHERE s_w_id = p_supply_w_ids[i] AND s_i_id = p_item_ids[i] FOR UPDATE;
        UPDATE stock
           SET s_quantity = CASE WHEN v_s_quantity - p_quantities[i] >= 10
                                 THEN v_s_quantity - p_quantities[i]
                                 ELSE v_s_quantity - p_quantities[i] + 91 END,
               s_ytd = s_ytd + p_quantities[i],
               s_order_cnt = s_order_cnt + 1,
               s_remote_cnt = s_remote_cnt + CASE WHEN p_supply_w_ids[i] <> p_w_id THEN 1 ELSE 0 END
         WHERE s_w_id = p_supply_w_ids[i] AND s_i_id = p_item_ids[i];
        v_amount := p_quantities[i] * v_price;
        INSERT INTO order_line (ol_w_id, ol_d_id, ol_o_id, ol_number, ol_i_id, ol_supply_w_id,
                                ol_delivery_d, ol_quantity, ol_amount, ol_dist_info)
        VALUES (p_w_id, p_d_id, v_o_id, i, p_item_ids[i], p_supply_w_ids[i],
                NULL, p_quantities[i], v_amount, v_dist_info);
        v_total := v_total + v_amount;
    END LOOP;
    RETURN round(v_total * (1 - v_discount) * (1 + v_w_tax + v_d_tax), 2);
END
$$;

-- The customer a Payment or Order-Status names by last name: the one in the
-- middle (rounded up) of those with that name, sorted by first name (2.5.2.2).
CREATE FUNCTION customer_by_name(p_w_id int, p_d_id int, p_c_last text)
RETURNS int LANGUAGE sql STABLE AS $$
    SELECT c_id FROM customer
     WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_last = p_c_last
     ORDER BY c_first
    OFFSET (SELECT (count(*) - 1) / 2 FROM customer
             WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_last = p_c_last)
     LIMIT 1
$$;

-- Payment (2.5): the customer is given by id, or by last name when p_c_id is 0;
-- 15% of them belong to another warehouse.
CREATE FUNCTION payment(p_w_id int, p_d_id int, p_c_w_id int, p_c_d_id int,
                        p_c_id int, p_c_last text, p_amount numeric)
RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    v_w_name text;
    v_d_name text;
    v_c_id int := p_c_id;
    v_credit text;
    v_balance numeric;
BEGIN
    UPDATE warehouse SET w_ytd = w_ytd + p_amount WHERE w_id = p_w_id RETURNING w_name INTO v_w_name;
    UPDATE district SET d_ytd = d_ytd + p_amount
     WHERE d_w_id = p_w_id AND d_id = p_d_id RETURNING d_name INTO v_d_name;
    IF v_c_id = 0 THEN
        v_c_id := customer_by_name(p_c_w_id, p_c_d_id, p_c_last);
    END IF;
    SELECT c_credit INTO v_credit FROM customer
     WHERE c_w_id = p_c_w_id AND c_d_id = p_c_d_id AND c_id = v_c_id FOR UPDATE;
    UPDATE customer
       SET c_balance = c_balance - p_amount,
           c_ytd_payment = c_ytd_payment + p_amount,
           c_payment_cnt = c_payment_cnt + 1,
           c_data = CASE WHEN v_credit = 'BC'
                         THEN left(format('%s %s %s %s %s %s|', v_c_id, p_c_d_id, p_c_w_id, p_d_id, p_w_id, p_amount) || c_data, 500)
                         ELSE c_data END
     WHERE c_w_id = p_c_w_id AND c_d_id = p_c_d_id AND c_id = v_c_id
    RETURNING c_balance INTO v_balance;
    INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data)
    VALUES (v_c_id, p_c_d_id, p_c_w_id, p_d_id, p_w_id, now(), p_amount, v_w_name || '    ' || v_d_name);
    RETURN v_balance;
END
$$;

-- Order-Status (2.6): the customer's last order and its lines; returns the
-- number of lines.
CREATE FUNCTION ostat(p_w_id int, p_d_id int, p_c_id int, p_c_last text)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    v_c_id int := p_c_id;
    v_balance numeric;
    v_o_id int;
    v_lines int;
BEGIN
    IF v_c_id = 0 THEN
        v_c_id := customer_by_name(p_w_id, p_d_id, p_c_last);
    END IF;
    SELECT c_balance INTO v_balance FROM customer
     WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_id = v_c_id;
    SELECT o_id INTO v_o_id FROM orders
     WHERE o_w_id = p_w_id AND o_d_id = p_d_id AND o_c_id = v_c_id
     ORDER BY o_id DESC LIMIT 1;
    SELECT count(*) INTO v_lines FROM order_line
     WHERE ol_w_id = p_w_id AND ol_d_id = p_d_id AND ol_o_id = v_o_id;
    RETURN v_lines;
END
$$;

-- Delivery (2.7): the oldest undelivered order of each of the warehouse's ten
-- districts; returns how many were delivered.
CREATE FUNCTION delivery(p_w_id int, p_carrier_id int)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    v_o_id int;
    v_c_id int;
    v_amount numeric;
    v_delivered int := 0;
BEGIN
    FOR v_d_id IN 1 .. 10 LOOP
        SELECT no_o_id INTO v_o_id FROM new_order
         WHERE no_w_id = p_w_id AND no_d_id = v_d_id
         ORDER BY no_o_id LIMIT 1 FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        DELETE FROM new_order WHERE no_w_id = p_w_id AND no_d_id = v_d_id AND no_o_id = v_o_id;
        UPDATE orders SET o_carrier_id = p_carrier_id
         WHERE o_w_id = p_w_id AND o_d_id = v_d_id AND o_id = v_o_id
        RETURNING o_c_id INTO v_c_id;
        UPDATE order_line SET ol_delivery_d = now()
         WHERE ol_w_id = p_w_id AND ol_d_id = v_d_id AND ol_o_id = v_o_id;
        SELECT sum(ol_amount) INTO v_amount FROM order_line
         WHERE ol_w_id = p_w_id AND ol_d_id = v_d_id AND ol_o_id = v_o_id;
        UPDATE customer SET c_balance = c_balance + v_amount, c_delivery_cnt = c_delivery_cnt + 1
         WHERE c_w_id = p_w_id AND c_d_id = v_d_id AND c_id = v_c_id;
        v_delivered := v_delivered + 1;
    END LOOP;
    RETURN v_delivered;
END
$$;

-- Stock-Level (2.8): distinct items of the district's last 20 orders whose
-- stock is below the threshold.
CREATE FUNCTION slev(p_w_id int, p_d_id int, p_threshold int)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    v_next_o_id int;
    v_low int;
BEGIN
    SELECT d_next_o_id INTO v_next_o_id FROM district WHERE d_w_id = p_w_id AND d_id = p_d_id;
    SELECT count(DISTINCT s_i_id) INTO v_low
      FROM order_line JOIN stock ON s_w_id = ol_w_id AND s_i_id = ol_i_id
     WHERE ol_w_id = p_w_id AND ol_d_id = p_d_id
       AND ol_o_id >= v_next_o_id - 20 AND ol_o_id < v_next_o_id
       AND s_quantity < p_threshold;
    RETURN v_low;
END
$$;
